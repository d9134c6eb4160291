package netnsholder

import (
	"strings"

	"github.com/docker/docker/api/types/container"

	"github.com/mercator/mercator/dockerengine"
)

// Joinable reports whether a function container on network (a Docker
// network mode; "" is the daemon's default bridge) gains from a holder:
// on a bridge or a user-defined network its start would make a network
// namespace, which joining the holder's saves. On "host" there is none to
// make, and "none" and "container:…" are the operator's choice of
// isolation or of another namespace, which a holder would change: those
// are prepared as before.
func Joinable(network string) bool {
	return network != "host" && network != "none" && !strings.HasPrefix(network, "container:")
}

// NetworkMode is the network mode of a container joining the namespace of
// the holder holderID.
func NetworkMode(holderID string) container.NetworkMode {
	return container.NetworkMode("container:" + holderID)
}

// Holder limits: the program maps one page and never allocates, forks or
// starts a thread. The process limit leaves room for the runtime's own
// short-lived processes while the container starts; the memory limit is
// Docker's minimum.
const (
	MemoryBytes = 6 << 20
	PidsLimit   = 8
)

// ContainerConfig is the holder container of image ref (Ensure's) on
// network, carrying labels: read-only, as nobody, logging to no driver (it
// writes nothing), with MemoryBytes of memory, swap included, and held to
// containment (dockerengine.Containment.Apply) with PidsLimit processes.
// The container that joins it gets its hostname, /etc/hosts and DNS
// configuration from it, as Docker does for every container:ID mode.
func ContainerConfig(ref, network string, containment dockerengine.Containment, labels map[string]string) (*container.Config, *container.HostConfig) {
	hostConfig := &container.HostConfig{
		NetworkMode:    container.NetworkMode(network),
		LogConfig:      container.LogConfig{Type: "none"},
		ReadonlyRootfs: true,
		Resources:      container.Resources{Memory: MemoryBytes, MemorySwap: MemoryBytes},
	}
	containment.Apply(hostConfig, PidsLimit)
	config := &container.Config{
		Image:  ref,
		User:   "65534:65534",
		Labels: labels,
	}
	return config, hostConfig
}
