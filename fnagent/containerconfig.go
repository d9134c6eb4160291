package fnagent

import (
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/mercator/mercator/dockerengine"
)

// containerConfig is the hot container one pool launches for fn: a pure
// function of the function's configuration, the pool, the node and the
// socket directory, so what the engine asks the daemon for is readable in
// one place. The container carries dockerengine.LabelFn, dockerengine.LabelApp, dockerengine.LabelPool (and
// dockerengine.LabelNode when nodeID is set), mounts sockDir at socketDirInContainer,
// joins network ("" is the daemon's default bridge), has a hard memory limit
// with swap included and a CPU quota, is handed gpus by UUID, and logs to no
// driver: the engine reads its output from the attach stream.
func containerConfig(fn FunctionConfig, poolKey, nodeID, network, sockDir string, gpus []string) (*container.Config, *container.HostConfig) {
	labels := map[string]string{dockerengine.LabelFn: fn.ID, dockerengine.LabelApp: fn.AppID, dockerengine.LabelPool: poolKey}
	if nodeID != "" {
		labels[dockerengine.LabelNode] = nodeID
	}
	memory := fn.MemoryMB << 20
	hostConfig := &container.HostConfig{
		Mounts:      []mount.Mount{{Type: mount.TypeBind, Source: sockDir, Target: socketDirInContainer}},
		NetworkMode: container.NetworkMode(network),
		// The engine reads the output from the attach stream, which the
		// daemon feeds whatever the log driver. A driver would also store
		// every line (an FDK writes two per call), costing the daemon CPU
		// on each call and the disk an unbounded file; the engine keeps
		// what a call wrote itself (Logs).
		LogConfig: container.LogConfig{Type: "none"},
		Resources: container.Resources{
			Memory:     memory,
			MemorySwap: memory,
			NanoCPUs:   fn.MilliCPUs * 1_000_000,
		},
	}
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
	return config, hostConfig
}
