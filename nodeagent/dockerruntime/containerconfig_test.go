package dockerruntime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// heldAt is the artifact path function of a node keeping copies under /a.
func heldAt(digest string) string { return "/a/sha256/" + digest + "/content" }

func TestContainerConfig(t *testing.T) {
	key := nodeproto.WorkloadKey{RunID: "r1", Attempt: 2}
	d1, d2 := strings.Repeat("1", 64), strings.Repeat("2", 64)
	artifact := func(digest, at string) nodeproto.ArtifactMount {
		return nodeproto.ArtifactMount{PrepareArtifactCommand: nodeproto.PrepareArtifactCommand{Name: "data", Version: "v1", SHA256: digest}, MountPath: at}
	}
	baseLabels := func(extra ...string) map[string]string {
		labels := map[string]string{dockerengine.LabelRun: "r1", dockerengine.LabelAttempt: "2", dockerengine.LabelTimeout: "0", dockerengine.LabelImage: fakeImage}
		for i := 0; i < len(extra); i += 2 {
			labels[extra[i]] = extra[i+1]
		}
		return labels
	}
	// contained is the host config every launch gets under testContainment,
	// changed by what the case asks.
	contained := func(change func(*container.HostConfig)) container.HostConfig {
		pids := testContainment.PidsLimit
		host := container.HostConfig{
			CapDrop:     []string{"AUDIT_WRITE", "MKNOD", "NET_RAW", "SETFCAP", "SETPCAP", "SYS_CHROOT"},
			SecurityOpt: []string{"no-new-privileges"},
			LogConfig:   container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "2097152", "max-file": "4"}},
			Resources:   container.Resources{PidsLimit: &pids, NanoCPUs: 2e9, Memory: 512 << 20, MemorySwap: 512 << 20},
		}
		if change != nil {
			change(&host)
		}
		return host
	}
	for _, tc := range []struct {
		name   string
		launch nodeproto.LaunchWorkloadCommand
		nodeID string
		config container.Config
		host   container.HostConfig
	}{{
		name:   "bare: the image, the command as arguments, the node's containment and default limits",
		launch: nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Command: []string{"train", "--fast"}},
		config: container.Config{Image: fakeImage, Cmd: []string{"train", "--fast"}, Labels: baseLabels()},
		host:   contained(nil),
	}, {
		name:   "node label, timeout in nanoseconds, environment sorted",
		nodeID: "n1",
		launch: nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Timeout: 90 * time.Second,
			Env: map[string]string{"B": "2", "A": "1", "EMPTY": ""}},
		config: container.Config{Image: fakeImage, Env: []string{"A=1", "B=2", "EMPTY="},
			Labels: baseLabels(dockerengine.LabelNode, "n1", dockerengine.LabelTimeout, fmt.Sprint(int64(90*time.Second)))},
		host: contained(nil),
	}, {
		name: "the run's secrets in the environment beside Env, in no label",
		launch: nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Env: map[string]string{"B": "2"},
			SecretNames: []string{"TOKEN"}, Secrets: map[string]string{"TOKEN": "s3cret"}},
		config: container.Config{Image: fakeImage, Env: []string{"B=2", "TOKEN=s3cret"}, Labels: baseLabels()},
		host:   contained(nil),
	}, {
		name:   "a negative timeout is none",
		launch: nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Timeout: -time.Second},
		config: container.Config{Image: fakeImage, Labels: baseLabels()},
		host:   contained(nil),
	}, {
		name:   "CPU as a quota, memory as a hard limit with swap",
		launch: nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, CPU: 1.5, MemoryBytes: 64 << 20},
		config: container.Config{Image: fakeImage, Labels: baseLabels()},
		host: contained(func(h *container.HostConfig) {
			h.NanoCPUs, h.Memory, h.MemorySwap = 15e8, 64<<20, 64<<20
		}),
	}, {
		name: "what a run may ask: a user, a read-only root, no network, more processes",
		launch: nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage,
			User: "1000:1000", ReadOnlyRootfs: true, Network: "none", PidsLimit: 9000},
		config: container.Config{Image: fakeImage, Labels: baseLabels(), User: "1000:1000"},
		host: contained(func(h *container.HostConfig) {
			pids := int64(9000)
			h.PidsLimit, h.ReadonlyRootfs, h.NetworkMode = &pids, true, "none"
		}),
	}, {
		name:   "GPUs by UUID to the NVIDIA runtime",
		launch: nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, GPUs: []string{"GPU-b", "GPU-a"}},
		config: container.Config{Image: fakeImage, Labels: baseLabels()},
		host: contained(func(h *container.HostConfig) {
			h.DeviceRequests = []container.DeviceRequest{{Driver: "nvidia", DeviceIDs: []string{"GPU-b", "GPU-a"}, Capabilities: [][]string{{"gpu"}}}}
		}),
	}, {
		name: "Artifacts mounted read-only, each digest named once",
		launch: nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage,
			Artifacts: []nodeproto.ArtifactMount{artifact(d2, "/data"), artifact(d1, "/weights"), artifact(d2, "/data2")}},
		config: container.Config{Image: fakeImage, Labels: baseLabels(dockerengine.LabelArtifacts, d2+","+d1)},
		host: contained(func(h *container.HostConfig) {
			h.Mounts = []mount.Mount{
				{Type: mount.TypeBind, Source: heldAt(d2), Target: "/data", ReadOnly: true},
				{Type: mount.TypeBind, Source: heldAt(d1), Target: "/weights", ReadOnly: true},
				{Type: mount.TypeBind, Source: heldAt(d2), Target: "/data2", ReadOnly: true},
			}
		}),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			config, host, err := containerConfig(tc.launch, tc.nodeID, testContainment, heldAt)
			if err != nil {
				t.Fatalf("containerConfig: %v", err)
			}
			if !reflect.DeepEqual(*config, tc.config) {
				t.Errorf("config =\n%+v\nwant\n%+v", *config, tc.config)
			}
			if !reflect.DeepEqual(*host, tc.host) {
				t.Errorf("host config =\n%+v\nwant\n%+v", *host, tc.host)
			}
		})
	}
}

func TestContainerConfigRefuses(t *testing.T) {
	key := nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}
	digest := strings.Repeat("a", 64)
	mountAt := func(paths ...string) []nodeproto.ArtifactMount {
		var m []nodeproto.ArtifactMount
		for _, p := range paths {
			m = append(m, nodeproto.ArtifactMount{PrepareArtifactCommand: nodeproto.PrepareArtifactCommand{Name: "data", Version: "v1", SHA256: digest}, MountPath: p})
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		launch nodeproto.LaunchWorkloadCommand
		field  string
	}{
		{"no run ID", nodeproto.LaunchWorkloadCommand{Image: fakeImage}, "run_id"},
		{"negative attempt", nodeproto.LaunchWorkloadCommand{WorkloadKey: nodeproto.WorkloadKey{RunID: "r1", Attempt: -1}, Image: fakeImage}, "attempt"},
		{"negative CPU", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, CPU: -1}, "cpu"},
		{"CPU not a number", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, CPU: math.NaN()}, "cpu"},
		{"infinite CPU", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, CPU: math.Inf(1)}, "cpu"},
		{"negative memory", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, MemoryBytes: -1}, "memory_bytes"},
		{"image by tag", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: "registry.test/team/job:latest"}, "image"},
		{"env name with =", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Env: map[string]string{"A=B": "1"}}, "env"},
		{"empty env name", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Env: map[string]string{"": "1"}}, "env"},
		{"relative mount path", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Artifacts: mountAt("data")}, "artifacts"},
		{"mount at /", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Artifacts: mountAt("/")}, "artifacts"},
		{"unclean mount path", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Artifacts: mountAt("/data/../etc")}, "artifacts"},
		{"two mounts at one path", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Artifacts: mountAt("/data", "/data")}, "artifacts"},
		{"host network", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Network: "host"}, "network"},
		{"another container's network", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Network: "container:abc"}, "network"},
		{"user as an option", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, User: "-u0"}, "user"},
		{"more processes than the node allows", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, PidsLimit: testContainment.MaxPidsLimit + 1}, "pids_limit"},
		{"negative pids limit", nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, PidsLimit: -1}, "pids_limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := containerConfig(tc.launch, "n1", testContainment, heldAt)
			var invalid *failure.Error
			if !errors.Is(err, failure.ErrInvalid) || !errors.As(err, &invalid) || invalid.Field != tc.field {
				t.Errorf("containerConfig = %v, want failure.ErrInvalid on field %q", err, tc.field)
			}
		})
	}
}

// testContainment is a node's containment with figures unlike the
// defaults, so a test sees they come from the configuration.
var testContainment = dockerengine.Containment{DefaultCPU: 2, DefaultMemoryBytes: 512 << 20, PidsLimit: 300, MaxPidsLimit: 10000, LogMaxBytes: 8 << 20}

// TestContainerConfigReachesNothingOfTheHost: whatever a launch command
// says, the container is never privileged, never on the host's network,
// PID, IPC or UTS namespace, keeps the dropped capabilities dropped and
// no-new-privileges set, mounts nothing but its Artifacts read-only, and
// gets no device but the GPUs it was assigned. The command is the whole of
// what the control plane can ask of a node, so this is the whole of what a
// spec can reach.
func TestContainerConfigReachesNothingOfTheHost(t *testing.T) {
	digest := strings.Repeat("a", 64)
	for _, launch := range []nodeproto.LaunchWorkloadCommand{
		{WorkloadKey: nodeproto.WorkloadKey{RunID: "r1"}, Image: fakeImage},
		{WorkloadKey: nodeproto.WorkloadKey{RunID: "r1"}, Image: fakeImage, User: "0", Network: "none", PidsLimit: 1,
			CPU: 64, MemoryBytes: 1 << 40, GPUs: []string{"GPU-1"}, Env: map[string]string{"DOCKER_HOST": "unix:///var/run/docker.sock"},
			Artifacts: []nodeproto.ArtifactMount{{PrepareArtifactCommand: nodeproto.PrepareArtifactCommand{Name: "d", Version: "v1", SHA256: digest}, MountPath: "/var/run"}}},
	} {
		_, host, err := containerConfig(launch, "n1", testContainment, heldAt)
		if err != nil {
			t.Fatalf("containerConfig(%+v): %v", launch, err)
		}
		switch {
		case host.Privileged || len(host.CapAdd) > 0 || len(host.Binds) > 0 || len(host.Devices) > 0 || len(host.DeviceCgroupRules) > 0:
			t.Errorf("host config widens the container: %+v", host)
		case host.NetworkMode.IsHost() || host.PidMode.IsHost() || host.IpcMode.IsHost() || host.UTSMode.IsHost() || host.UsernsMode.IsHost() || host.CgroupnsMode.IsHost():
			t.Errorf("host config shares a host namespace: %+v", host)
		case !reflect.DeepEqual([]string(host.CapDrop), dockerengine.DroppedCapabilities) || !reflect.DeepEqual(host.SecurityOpt, []string{dockerengine.NoNewPrivileges}):
			t.Errorf("CapDrop %v, SecurityOpt %v; want %v and no-new-privileges", host.CapDrop, host.SecurityOpt, dockerengine.DroppedCapabilities)
		case host.PidsLimit == nil || *host.PidsLimit <= 0:
			t.Errorf("PidsLimit = %v, want a positive limit", host.PidsLimit)
		}
		for _, m := range host.Mounts {
			if !m.ReadOnly || m.Source != heldAt(digest) {
				t.Errorf("mount %+v is not an Artifact mounted read-only", m)
			}
		}
		for _, d := range host.DeviceRequests {
			if !reflect.DeepEqual(d.DeviceIDs, launch.GPUs) {
				t.Errorf("device request %+v, want only the assigned GPUs %v", d, launch.GPUs)
			}
		}
	}
}

// TestLaunchOfAHeldImageAsksNothingOfIt: the agent's image step prepared
// the image, so the launch goes straight to the create; only a create that
// finds the image missing pulls it, once, and creates again.
func TestLaunchOfAHeldImageAsksNothingOfIt(t *testing.T) {
	key := nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}
	launch := nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Command: []string{"train"}}
	held := &fakeDocker{
		containerCreate: func(*container.Config, *container.HostConfig, string) (container.CreateResponse, error) {
			return container.CreateResponse{ID: "c1"}, nil
		},
		containerStart: func(string) error { return nil },
	}
	if err := newRuntime(held).LaunchWorkload(context.Background(), launch); err != nil {
		t.Fatalf("LaunchWorkload of a held image: %v", err)
	}
	if n := held.count("Image"); n != 0 {
		t.Errorf("the launch of a held image made %d image calls (%v), want none", n, held.calls)
	}

	var pulled atomic.Bool
	missing := &fakeDocker{
		imageInspect: func(string) (image.InspectResponse, error) {
			if pulled.Load() {
				return image.InspectResponse{ID: "sha256:abc"}, nil
			}
			return image.InspectResponse{}, daemonNotFound("image")
		},
		imagePull: func(context.Context, string, image.PullOptions) (io.ReadCloser, error) {
			pulled.Store(true)
			return io.NopCloser(strings.NewReader(`{"status":"Downloaded newer image"}`)), nil
		},
		containerCreate: func(*container.Config, *container.HostConfig, string) (container.CreateResponse, error) {
			if !pulled.Load() {
				return container.CreateResponse{}, daemonNotFound("image: " + fakeImage)
			}
			return container.CreateResponse{ID: "c1"}, nil
		},
		containerStart: func(string) error { return nil },
	}
	if err := newRuntime(missing).LaunchWorkload(context.Background(), launch); err != nil {
		t.Fatalf("LaunchWorkload of a missing image: %v", err)
	}
	if p, c := missing.count("ImagePull"), missing.count("ContainerCreate"); p != 1 || c != 2 {
		t.Errorf("a launch of a missing image made %d pulls and %d creates, want 1 and 2", p, c)
	}
}
