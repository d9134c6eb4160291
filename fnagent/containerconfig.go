package fnagent

import (
	"math"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/fnagent/internal/fdksocket"
	"github.com/mercator/mercator/fnagent/internal/netnsholder"
	"github.com/mercator/mercator/fnagent/outputrelay"
)

// containerConfig is the hot container one pool launches for fn: a pure
// function of the function's configuration, the pool, the socket directory,
// the GPUs, the command and the engine's configuration (cfg, whose
// Containment is set),
// so what the engine asks the daemon for is readable in one place. The
// container carries dockerengine.LabelFn, dockerengine.LabelApp,
// dockerengine.LabelPool (and dockerengine.LabelNode when cfg.NodeID is
// set), mounts sockDir at fdksocket.DirInContainer, joins cfg.Network ("" is
// the daemon's default bridge) or, when holder (a container's ID) is set,
// that holder's network namespace (netns.go; Docker then refuses a
// hostname, DNS settings or ports of the joining container's own, and none
// is set here), has a hard memory limit with swap included
// and a CPU quota (the containment's default when the function states
// none), is handed gpus by UUID, is held to the node's containment
// (dockerengine.Containment.Apply: capabilities dropped, no-new-privileges,
// a process limit), and logs to no driver: the engine reads its output from
// the attach stream. A command (relayCommand: the image's own run through
// the output relay) is the container's entrypoint, replacing the image's
// entrypoint and command, with cfg.OutputRelay mounted read-only where
// the command names it; nil leaves the image's.
//
// A function asks for no user, read-only root or network of its own: its
// container serves every call of the function for as long as it is hot,
// the FDK creates its socket in the mounted directory as whatever user the
// image names, and the engine's network is the operator's choice for all
// functions on the node.
func containerConfig(fn FunctionConfig, poolKey, sockDir string, gpus []string, holder string, command []string, cfg Config) (*container.Config, *container.HostConfig) {
	labels := map[string]string{dockerengine.LabelFn: fn.ID, dockerengine.LabelApp: fn.AppID, dockerengine.LabelPool: poolKey}
	if cfg.NodeID != "" {
		labels[dockerengine.LabelNode] = cfg.NodeID
	}
	memory := fn.MemoryMB << 20
	nanoCPUs := fn.MilliCPUs * 1_000_000
	if nanoCPUs == 0 {
		nanoCPUs = int64(math.Round(cfg.Containment.DefaultCPU * 1e9))
	}
	hostConfig := &container.HostConfig{
		Mounts:      []mount.Mount{{Type: mount.TypeBind, Source: sockDir, Target: fdksocket.DirInContainer}},
		NetworkMode: container.NetworkMode(cfg.Network),
		// The engine reads the output from the attach stream, which the
		// daemon feeds whatever the log driver. A driver would also store
		// every line (an FDK writes two per call), costing the daemon CPU
		// on each call and the disk an unbounded file; the engine keeps
		// what a call wrote itself (Logs).
		LogConfig: container.LogConfig{Type: "none"},
		Resources: container.Resources{
			Memory:     memory,
			MemorySwap: memory,
			NanoCPUs:   nanoCPUs,
		},
	}
	if holder != "" {
		hostConfig.NetworkMode = netnsholder.NetworkMode(holder)
	}
	cfg.Containment.Apply(hostConfig, 0)
	if len(gpus) > 0 {
		hostConfig.DeviceRequests = []container.DeviceRequest{{Driver: "nvidia", DeviceIDs: gpus, Capabilities: [][]string{{"gpu"}}}}
	}
	config := &container.Config{
		Image:        fn.Image,
		Env:          containerEnv(fn),
		Labels:       labels,
		AttachStdout: true,
		AttachStderr: true,
	}
	if command != nil {
		config.Entrypoint = command
		hostConfig.Mounts = append(hostConfig.Mounts, mount.Mount{Type: mount.TypeBind, Source: cfg.OutputRelay, Target: outputrelay.InContainer, ReadOnly: true})
	}
	return config, hostConfig
}
