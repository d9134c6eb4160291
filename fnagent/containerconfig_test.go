package fnagent

import (
	"reflect"
	"slices"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/fnagent/internal/fdksocket"
	"github.com/mercator/mercator/fnagent/outputrelay"
)

func TestContainerConfig(t *testing.T) {
	fn := FunctionConfig{ID: "fn-1", AppID: "app-1", Image: "img@sha256:1", MemoryMB: 128, MilliCPUs: 500}
	for _, tc := range []struct {
		name, nodeID, network string
		holder, mode          string
		gpus                  []string
		labels                map[string]string
		devices               []container.DeviceRequest
		command               []string
	}{
		{name: "no node, default network, no GPUs",
			labels: map[string]string{dockerengine.LabelFn: "fn-1", dockerengine.LabelApp: "app-1", dockerengine.LabelPool: "pool-1"}},
		{name: "node label, network and GPUs by UUID", nodeID: "n1", network: "fns", gpus: []string{"GPU-a"},
			labels:  map[string]string{dockerengine.LabelFn: "fn-1", dockerengine.LabelApp: "app-1", dockerengine.LabelPool: "pool-1", dockerengine.LabelNode: "n1"},
			mode:    "fns",
			devices: []container.DeviceRequest{{Driver: "nvidia", DeviceIDs: []string{"GPU-a"}, Capabilities: [][]string{{"gpu"}}}}},
		{name: "prepared in a holder's namespace: the holder's network mode, not the engine's", nodeID: "n1", network: "fns", holder: "h123",
			labels: map[string]string{dockerengine.LabelFn: "fn-1", dockerengine.LabelApp: "app-1", dockerengine.LabelPool: "pool-1", dockerengine.LabelNode: "n1"},
			mode:   "container:h123"},
		{name: "through the output relay: its command the entrypoint, the relay mounted read-only",
			labels:  map[string]string{dockerengine.LabelFn: "fn-1", dockerengine.LabelApp: "app-1", dockerengine.LabelPool: "pool-1"},
			command: outputrelay.Entrypoint(fdksocket.DirInContainer, []string{"/app/func", "--serve"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			contain := dockerengine.Containment{DefaultCPU: 3, PidsLimit: 321, MaxPidsLimit: 1000, LogMaxBytes: 1 << 20}
			config, host := containerConfig(fn, "pool-1", "/sockets/abc", tc.gpus, tc.holder, tc.command,
				Config{NodeID: tc.nodeID, Network: tc.network, Containment: &contain, OutputRelay: "/opt/mercator/bin/mercator"})
			if config.Image != fn.Image || !reflect.DeepEqual(config.Labels, tc.labels) || !config.AttachStdout || !config.AttachStderr {
				t.Errorf("config = %+v, want the image, labels %v and both streams attached", config, tc.labels)
			}
			if !reflect.DeepEqual(config.Env, containerEnv(fn)) {
				t.Errorf("Env = %v, want containerEnv's %v", config.Env, containerEnv(fn))
			}
			wantMounts := []mount.Mount{{Type: mount.TypeBind, Source: "/sockets/abc", Target: fdksocket.DirInContainer}}
			if tc.command != nil {
				wantMounts = append(wantMounts, mount.Mount{Type: mount.TypeBind, Source: "/opt/mercator/bin/mercator", Target: outputrelay.InContainer, ReadOnly: true})
			}
			if !slices.Equal(config.Entrypoint, tc.command) || config.Cmd != nil {
				t.Errorf("Entrypoint %q, Cmd %q; want %q and none (the image's, when no command is given)", config.Entrypoint, config.Cmd, tc.command)
			}
			if !reflect.DeepEqual(host.Mounts, wantMounts) || host.NetworkMode != container.NetworkMode(tc.mode) || host.LogConfig.Type != "none" {
				t.Errorf("host config = %+v, want the socket directory mounted, network mode %q and no log driver", host, tc.mode)
			}
			// What Docker refuses on a container joining another's
			// namespace, and would otherwise differ between a spare in a
			// holder's and a container with its own: set on none.
			if config.Hostname != "" || config.Domainname != "" || len(config.ExposedPorts) != 0 || host.DNS != nil || host.DNSSearch != nil ||
				host.DNSOptions != nil || host.ExtraHosts != nil || host.PortBindings != nil || host.PublishAllPorts || host.Links != nil {
				t.Errorf("config %+v, host config %+v: a hostname, DNS, hosts or ports set", config, host)
			}
			if host.Memory != 128<<20 || host.MemorySwap != 128<<20 || host.NanoCPUs != 5e8 {
				t.Errorf("resources = Memory %d, MemorySwap %d, NanoCPUs %d; want a hard 128MiB and half a core", host.Memory, host.MemorySwap, host.NanoCPUs)
			}
			if host.Privileged || !reflect.DeepEqual([]string(host.CapDrop), dockerengine.DroppedCapabilities) ||
				!reflect.DeepEqual(host.SecurityOpt, []string{dockerengine.NoNewPrivileges}) || host.PidsLimit == nil || *host.PidsLimit != 321 {
				t.Errorf("Privileged %v, CapDrop %v, SecurityOpt %v, PidsLimit %v; want the node's containment with 321 processes",
					host.Privileged, host.CapDrop, host.SecurityOpt, host.PidsLimit)
			}
			if !reflect.DeepEqual(host.DeviceRequests, tc.devices) {
				t.Errorf("DeviceRequests = %+v, want %+v", host.DeviceRequests, tc.devices)
			}
		})
	}
}

// TestContainerConfigDefaultCPU: a function that states no CPU gets the
// node's default quota rather than the whole machine; one that states its
// own keeps it.
func TestContainerConfigDefaultCPU(t *testing.T) {
	contain := dockerengine.DefaultContainment()
	contain.DefaultCPU = 1.5
	cfg := Config{Containment: &contain}
	for _, tc := range []struct {
		milliCPUs, want int64
	}{{0, 15e8}, {250, 25e7}} {
		fn := FunctionConfig{ID: "fn-1", AppID: "app-1", Image: "img@sha256:1", MemoryMB: 128, MilliCPUs: tc.milliCPUs}
		if _, host := containerConfig(fn, "pool-1", "/s", nil, "", nil, cfg); host.NanoCPUs != tc.want {
			t.Errorf("MilliCPUs %d: NanoCPUs = %d, want %d", tc.milliCPUs, host.NanoCPUs, tc.want)
		}
	}
}
