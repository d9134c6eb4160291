package fnagent

import (
	"reflect"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/mercator/mercator/dockerengine"
)

func TestContainerConfig(t *testing.T) {
	fn := FunctionConfig{ID: "fn-1", AppID: "app-1", Image: "img@sha256:1", MemoryMB: 128, MilliCPUs: 500}
	for _, tc := range []struct {
		name, nodeID, network string
		gpus                  []string
		labels                map[string]string
		devices               []container.DeviceRequest
	}{
		{name: "no node, default network, no GPUs",
			labels: map[string]string{dockerengine.LabelFn: "fn-1", dockerengine.LabelApp: "app-1", dockerengine.LabelPool: "pool-1"}},
		{name: "node label, network and GPUs by UUID", nodeID: "n1", network: "fns", gpus: []string{"GPU-a"},
			labels:  map[string]string{dockerengine.LabelFn: "fn-1", dockerengine.LabelApp: "app-1", dockerengine.LabelPool: "pool-1", dockerengine.LabelNode: "n1"},
			devices: []container.DeviceRequest{{Driver: "nvidia", DeviceIDs: []string{"GPU-a"}, Capabilities: [][]string{{"gpu"}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config, host := containerConfig(fn, "pool-1", tc.nodeID, tc.network, "/sockets/abc", tc.gpus)
			if config.Image != fn.Image || !reflect.DeepEqual(config.Labels, tc.labels) || !config.AttachStdout || !config.AttachStderr {
				t.Errorf("config = %+v, want the image, labels %v and both streams attached", config, tc.labels)
			}
			if !reflect.DeepEqual(config.Env, containerEnv(fn)) {
				t.Errorf("Env = %v, want containerEnv's %v", config.Env, containerEnv(fn))
			}
			wantMounts := []mount.Mount{{Type: mount.TypeBind, Source: "/sockets/abc", Target: socketDirInContainer}}
			if !reflect.DeepEqual(host.Mounts, wantMounts) || host.NetworkMode != container.NetworkMode(tc.network) || host.LogConfig.Type != "none" {
				t.Errorf("host config = %+v, want the socket directory mounted, network %q and no log driver", host, tc.network)
			}
			if host.Memory != 128<<20 || host.MemorySwap != 128<<20 || host.NanoCPUs != 5e8 {
				t.Errorf("resources = Memory %d, MemorySwap %d, NanoCPUs %d; want a hard 128MiB and half a core", host.Memory, host.MemorySwap, host.NanoCPUs)
			}
			if !reflect.DeepEqual(host.DeviceRequests, tc.devices) {
				t.Errorf("DeviceRequests = %+v, want %+v", host.DeviceRequests, tc.devices)
			}
		})
	}
}
