package dockerruntime

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"

	"github.com/docker/docker/api/types/image"

	"github.com/mercator/mercator/hostfacts"
	"github.com/mercator/mercator/nodeproto"
)

// Facts reports what this machine measured about itself: host name, OS and
// architecture, CPUs, memory, the free space where Artifacts are kept, the
// Docker daemon's version, and the images it holds by digest. A limit this
// process runs under is the machine's answer: CPUs are capped by a cgroup
// CPU quota and memory by a cgroup memory limit where one applies (v1 and
// v2), because that is what a workload launched here can have.
//
// A figure that cannot be measured is left zero with a Note saying why, and
// the facts are returned anyway (a daemon that is down is itself a fact
// worth reporting); only the caller's context ending is an error.
// Accelerators are the NVIDIA GPUs the vendor tool lists, asked once per call
// and bounded by hostfacts.AcceleratorToolTimeout, and only when the kernel module is
// loaded and the container runtime can hand them to a container; otherwise
// none, with a Note saying why (hostfacts.Accelerators). AgentVersion is the agent's
// to fill.
func (docker *Runtime) Facts(ctx context.Context) (nodeproto.NodeFacts, error) {
	facts := nodeproto.NodeFacts{
		OS:                runtime.GOOS,
		Arch:              runtime.GOARCH,
		RuntimeName:       "docker",
		CapabilityVersion: nodeproto.Version,
	}
	note := func(format string, args ...any) { facts.Notes = append(facts.Notes, fmt.Sprintf(format, args...)) }

	if host, err := os.Hostname(); err == nil {
		facts.Hostname = host
	} else {
		note("hostname: %v", err)
	}

	procRoot := docker.kernelReports
	if procRoot == "" {
		procRoot = "/proc"
	}
	capacity, err := hostfacts.MeasureCapacity(procRoot, docker.cgroupRoot, runtime.NumCPU())
	facts.CPUs, facts.MemoryBytes = capacity.CPUs, capacity.MemoryBytes
	if err != nil {
		note("memory: %v", err)
	}

	accelerators, accelNotes, err := hostfacts.Accelerators(ctx, docker.acceleratorTool, procRoot)
	if err != nil {
		return nodeproto.NodeFacts{}, err
	}
	facts.Accelerators = accelerators
	facts.Notes = append(facts.Notes, accelNotes...)
	docker.withGPUHealth(&facts)

	if docker.artifactRoot == "" {
		note("disk free: not measured, because no artifact root is configured")
	} else if free, err := hostfacts.DiskFree(docker.artifactRoot); err == nil {
		facts.DiskFreeBytes = free
	} else {
		note("disk free at %s: %v", docker.artifactRoot, err)
	}

	if version, err := docker.api.ServerVersion(ctx); err == nil {
		facts.RuntimeVersion = version.Version
		facts.RuntimeAPIVersion = version.APIVersion
	} else {
		if ctx.Err() != nil {
			return nodeproto.NodeFacts{}, ctx.Err()
		}
		note("docker daemon version: %v", err)
	}
	images, err := docker.api.ImageList(ctx, image.ListOptions{})
	if err != nil {
		if ctx.Err() != nil {
			return nodeproto.NodeFacts{}, ctx.Err()
		}
		note("docker images: %v", err)
	}
	for _, summary := range images {
		for _, digest := range summary.RepoDigests {
			if !strings.Contains(digest, "<none>") && strings.Contains(digest, "@sha256:") {
				facts.Images = append(facts.Images, digest)
			}
		}
	}
	sort.Strings(facts.Images)
	facts.Images = slices.Compact(facts.Images)
	docker.artifacts.Describe(&facts)
	return facts, nil
}
