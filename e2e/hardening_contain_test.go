package e2e

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	dockerclient "github.com/docker/docker/client"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/dockerengine"
)

// Contained workloads end to end (docs/hardening.md, "Contained
// workloads"): what the daemon says about the containers a real agent made
// for a Run and for a function, and what the process inside sees of
// itself.

// containedCapBnd is the capability bounding set of a contained container,
// as /proc/self/status prints it: Docker's default set (CHOWN, DAC_OVERRIDE,
// FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, NET_RAW,
// SYS_CHROOT, MKNOD, AUDIT_WRITE, SETFCAP: 0xa80425fb) less
// dockerengine.DroppedCapabilities (bits 8, 13, 18, 27, 29, 31).
const containedCapBnd = "00000000000004fb"

// inspectContainer asks the daemon about one container.
func inspectContainer(t *testing.T, id string) container.InspectResponse {
	t.Helper()
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	info, err := cli.ContainerInspect(context.Background(), id)
	if err != nil {
		t.Fatalf("inspect %s: %v", id, err)
	}
	return info
}

// fnContainerID is the ID of the one container of a function.
func fnContainerID(t *testing.T, fnID string) string {
	t.Helper()
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// The one started: a deploy also has the node prepare the next
	// container, created and not started (fnagent's prepare.go).
	list, err := cli.ContainerList(context.Background(), container.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", dockerengine.LabelFn+"="+fnID), filters.Arg("status", "running"))})
	if err != nil || len(list) != 1 {
		t.Fatalf("running containers of function %s: %d, %v; want one", fnID, len(list), err)
	}
	return list[0].ID
}

// checkContained fails the test unless the daemon holds the container to
// the node's containment: the dropped capabilities (the daemon writes them
// CAP_-prefixed), no-new-privileges, never privileged, and the pids limit.
func checkContained(t *testing.T, what string, hc *container.HostConfig, pids int64) {
	t.Helper()
	var dropped []string
	for _, c := range hc.CapDrop {
		dropped = append(dropped, strings.TrimPrefix(c, "CAP_"))
	}
	slices.Sort(dropped)
	if !slices.Equal(dropped, dockerengine.DroppedCapabilities) {
		t.Errorf("%s: CapDrop = %v, want %v", what, hc.CapDrop, dockerengine.DroppedCapabilities)
	}
	if !slices.Equal(hc.SecurityOpt, []string{dockerengine.NoNewPrivileges}) || hc.Privileged || len(hc.CapAdd) > 0 {
		t.Errorf("%s: SecurityOpt %v, Privileged %v, CapAdd %v; want no-new-privileges alone, not privileged, nothing added", what, hc.SecurityOpt, hc.Privileged, hc.CapAdd)
	}
	if hc.PidsLimit == nil || *hc.PidsLimit != pids {
		t.Errorf("%s: PidsLimit = %v, want %d", what, hc.PidsLimit, pids)
	}
}

// statusLine is the value of one "Name:\tvalue" line of /proc/self/status.
func statusLine(status, name string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestContainedRunDefaults: a Run that asks for nothing gets, from an agent
// started with no containment options, the default containment: the
// dropped capabilities, no-new-privileges, 4,096 processes, a json-file
// log rotated within 256 MiB, one core and 2 GiB. The process inside sees
// the same: no new privileges, the reduced bounding set.
func TestContainedRunDefaults(t *testing.T) {
	c := startCluster(t)
	c.startAgent("contain")
	d := dockerengine.DefaultContainment()

	run := c.wait(c.submit(api.RunSpec{Command: []string{"cat", "/proc/self/status"}}).ID)
	if run.Status != api.RunSucceeded {
		t.Fatalf("run = %s (%s), logs %q", run.Status, run.Reason, c.logs(run.ID))
	}
	info := inspectContainer(t, run.Attempts[0].ContainerID)
	hc := info.HostConfig
	checkContained(t, "run", hc, d.PidsLimit)
	if hc.LogConfig.Type != "json-file" || hc.LogConfig.Config["max-size"] != "67108864" || hc.LogConfig.Config["max-file"] != "4" {
		t.Errorf("run: LogConfig = %+v, want json-file in 4 files of 64 MiB", hc.LogConfig)
	}
	if hc.NanoCPUs != 1e9 || hc.Memory != 2<<30 || hc.MemorySwap != 2<<30 {
		t.Errorf("run: NanoCpus %d, Memory %d, MemorySwap %d; want the defaults, one core and 2 GiB with no swap", hc.NanoCPUs, hc.Memory, hc.MemorySwap)
	}
	if hc.ReadonlyRootfs || hc.NetworkMode.IsNone() || info.Config.User != "" {
		t.Errorf("run: ReadonlyRootfs %v, NetworkMode %q, User %q; want what the spec asked: none of them", hc.ReadonlyRootfs, hc.NetworkMode, info.Config.User)
	}
	status := c.logs(run.ID)
	if got := statusLine(status, "NoNewPrivs"); got != "1" {
		t.Errorf("inside the run NoNewPrivs = %q, want 1", got)
	}
	if got := statusLine(status, "CapBnd"); got != containedCapBnd {
		t.Errorf("inside the run CapBnd = %q, want %s", got, containedCapBnd)
	}

	// A Run's own limits replace the defaults.
	sized := c.wait(c.submit(api.RunSpec{Command: []string{"exit", "0"}, CPU: 0.5, MemoryBytes: 64 << 20}).ID)
	if hc := inspectContainer(t, sized.Attempts[0].ContainerID).HostConfig; hc.NanoCPUs != 5e8 || hc.Memory != 64<<20 {
		t.Errorf("sized run: NanoCpus %d, Memory %d; want its own half core and 64 MiB", hc.NanoCPUs, hc.Memory)
	}
}

// TestContainedRunAsks: what a Run may ask for reaches its container (a
// user, a read-only root filesystem, no network, a larger process limit)
// and the test workload, a static program FROM scratch, still runs under
// it: as that user, unable to write its root, with loopback alone.
func TestContainedRunAsks(t *testing.T) {
	c := startCluster(t)
	c.startAgent("contain")
	asks := func(command ...string) api.Run {
		run := c.wait(c.submit(api.RunSpec{Command: command, User: "1000:1000", ReadOnlyRootfs: true, Network: api.NetworkNone, PidsLimit: 10000}).ID)
		if run.Status != api.RunSucceeded {
			t.Fatalf("run %q = %s (%s), logs %q", command, run.Status, run.Reason, c.logs(run.ID))
		}
		return run
	}

	run := asks("cat", "/proc/self/status")
	info := inspectContainer(t, run.Attempts[0].ContainerID)
	checkContained(t, "run", info.HostConfig, 10000)
	if !info.HostConfig.ReadonlyRootfs || !info.HostConfig.NetworkMode.IsNone() || info.Config.User != "1000:1000" {
		t.Errorf("ReadonlyRootfs %v, NetworkMode %q, User %q; want read-only, none, 1000:1000",
			info.HostConfig.ReadonlyRootfs, info.HostConfig.NetworkMode, info.Config.User)
	}
	status := c.logs(run.ID)
	if got := statusLine(status, "Uid"); !strings.HasPrefix(got, "1000") || statusLine(status, "NoNewPrivs") != "1" {
		t.Errorf("inside the run Uid %q, NoNewPrivs %q; want 1000 and 1", got, statusLine(status, "NoNewPrivs"))
	}
	if got := statusLine(status, "CapEff"); got != "0000000000000000" {
		t.Errorf("inside the run as 1000 CapEff = %q, want none", got)
	}
	if out := c.logs(asks("touch", "/written").ID); !strings.Contains(out, "read-only file system") {
		t.Errorf("touch on the read-only root printed %q, want a read-only file system error", out)
	}
	if out := c.logs(asks("cat", "/proc/net/dev").ID); strings.Contains(out, "eth0") || !strings.Contains(out, "lo:") {
		t.Errorf("the run's network devices are %q, want loopback alone", out)
	}
}

// TestContainedFunction: a function's hot container, made by the agent's
// function engine, is held to the same containment (the dropped
// capabilities, no-new-privileges, the process limit), keeps no log on the
// node (the engine reads the attach stream), and gets the node's default
// CPU quota when the function states none, with its own memory limit.
func TestContainedFunction(t *testing.T) {
	c := startCluster(t)
	c.startAgent("contain")
	d := dockerengine.DefaultContainment()
	_, fn := c.deployHello("contain", api.Fn{})
	if status, body := c.invoke(fn.ID, `{"name":"contained"}`); status != 200 || !strings.Contains(body, "Hello, contained") {
		t.Fatalf("invoke = %d %q", status, body)
	}
	hc := inspectContainer(t, fnContainerID(t, fn.ID)).HostConfig
	checkContained(t, "function", hc, d.PidsLimit)
	if hc.LogConfig.Type != "none" {
		t.Errorf("function: LogConfig = %+v, want none", hc.LogConfig)
	}
	if hc.NanoCPUs != 1e9 || hc.Memory != api.FnDefaultMemoryMB<<20 {
		t.Errorf("function: NanoCpus %d, Memory %d; want the node's default core and the function's %d MiB", hc.NanoCPUs, hc.Memory, api.FnDefaultMemoryMB)
	}
}

// BenchmarkContainmentOverhead: what the containment costs a container's
// start, measured as create → the daemon's StartedAt through the Docker
// API, for containers of the test image with the default containment (the
// dropped capabilities, no-new-privileges, the process limit, the rotated
// json-file log) and, interleaved in the same run as the baseline, the
// same container with only its CPU and memory limits; reported as medians
// and their ratio.
//
// Run it with: go test ./e2e -run '^$' -bench ContainmentOverhead -benchtime 1x
// (MERCATOR_BENCH_SAMPLES samples of each, default 25).
func BenchmarkContainmentOverhead(b *testing.B) {
	samples := benchSamples(b)
	c := startCluster(b)
	docker, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		b.Fatal(err)
	}
	defer docker.Close()
	pull, err := docker.ImagePull(context.Background(), c.workload, image.PullOptions{})
	if err != nil {
		b.Fatalf("pull %s: %v", c.workload, err)
	}
	io.Copy(io.Discard, pull)
	pull.Close()
	limits := container.Resources{NanoCPUs: 5e8, Memory: 64 << 20}
	contain := dockerengine.DefaultContainment()
	for i := 0; i < b.N; i++ {
		var plain, contained []time.Duration
		for s := 0; s < samples; s++ {
			plain = append(plain, rawLaunch(b, docker, c.workload, &container.HostConfig{Resources: limits}))
			hc := &container.HostConfig{Resources: limits, LogConfig: contain.RunLogConfig()}
			contain.Apply(hc, 0)
			contained = append(contained, rawLaunch(b, docker, c.workload, hc))
		}
		mc, mp := median(contained), median(plain)
		b.ReportMetric(float64(mc.Microseconds())/1000, "contained-ms")
		b.ReportMetric(float64(mp.Microseconds())/1000, "plain-ms")
		b.ReportMetric(float64(mc)/float64(mp), "ratio")
		fmt.Printf("container start over %d samples: contained median %v, plain median %v, ratio %.2f\n",
			samples, mc.Round(time.Millisecond), mp.Round(time.Millisecond), float64(mc)/float64(mp))
	}
}
