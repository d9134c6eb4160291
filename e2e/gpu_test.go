package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/nodeproto"
)

// gpuMachine is the fake machine the GPU tests stand in: eight H100s as the
// fixture in testdata/gpu describes them, with its nvidia-smi and its
// kernel's report of a loaded NVIDIA module.
const gpuMachine = "h100-80gb-hbm3-x8"

// requireGPUHook makes sure dockerd has its NVIDIA device driver registered,
// by running scripts/install-gpu-hook-standin.sh. The script does nothing
// but check when the driver is already there, which is how the suite is
// meant to find it (scripts/test.sh should run it right after starting
// dockerd, before any test); it installs the
// stand-in hook and restarts dockerd only on a machine that lacks it, which
// stops every running container, so it is not something to do while other
// packages' tests are running. It needs root; a failure fails the test,
// because a GPU test that skips is one CI never runs.
func requireGPUHook(t *testing.T) {
	t.Helper()
	script := filepath.Join(repoRoot(t), "scripts", "install-gpu-hook-standin.sh")
	out, err := exec.Command("bash", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// fakeKernelReports builds a kernel reports root for machine: the real
// /proc's meminfo and self (so memory and cgroup limits are this machine's)
// and the fixture's driver/ (so the NVIDIA module reads as loaded).
func fakeKernelReports(t *testing.T, machine string) string {
	t.Helper()
	root := t.TempDir()
	links := map[string]string{
		"meminfo": "/proc/meminfo",
		"self":    "/proc/self",
		"driver":  filepath.Join(repoRoot(t), "testdata", "gpu", machine, "proc", "driver"),
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// startAgentWith is startAgent with the agent's options adjusted by
// configure before it starts. It returns the node's ID.
func (c *cluster) startAgentWith(nodeID string, configure func(*daemon.AgentOptions)) string {
	c.t.Helper()
	nodeID = uniqueNodeID(c.t, nodeID)
	inv, err := c.client.InviteNode(c.ctx, nodeID, 0)
	if err != nil {
		c.t.Fatalf("invite %s: %v", nodeID, err)
	}
	options := daemon.AgentOptions{
		ControlPlaneURL: c.url, NodeID: nodeID, StateDir: filepath.Join(c.dataDir, "agent-"+nodeID),
		Invitation: inv.Token, Heartbeat: time.Second, Logger: testLogger(c.t).With("c", "agent", "node", nodeID),
	}
	configure(&options)
	ctx, cancel := context.WithCancel(c.ctx)
	c.agents[nodeID] = cancel
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := daemon.RunAgent(ctx, options); err != nil && ctx.Err() == nil {
			c.t.Errorf("agent %s stopped: %v", nodeID, err)
		}
	}()
	return nodeID
}

// startGPUAgent starts an agent standing in the 8×H100 machine and waits
// until the control plane holds its facts with the eight GPUs. It returns
// the node's ID and the GPUs as the fixture lists them.
func (c *cluster) startGPUAgent(t *testing.T) (string, []nodeproto.Accelerator) {
	t.Helper()
	nodeID := c.startAgentWith("gpu", func(o *daemon.AgentOptions) {
		o.AcceleratorTool = filepath.Join(repoRoot(t), "testdata", "gpu", gpuMachine, "nvidia-smi")
		o.KernelReports = fakeKernelReports(t, gpuMachine)
	})
	var facts nodeproto.NodeFacts
	c.waitFor("node "+nodeID+" ready with facts", func() bool {
		n, err := c.client.GetNode(c.ctx, nodeID)
		if err != nil || n.Status != "ready" || n.Facts == nil {
			return false
		}
		raw, _ := json.Marshal(n.Facts)
		facts = nodeproto.NodeFacts{}
		return json.Unmarshal(raw, &facts) == nil
	})
	if len(facts.Accelerators) != 8 {
		t.Fatalf("node reports %d accelerators, want the fixture's 8; notes: %q", len(facts.Accelerators), facts.Notes)
	}
	for _, gpu := range facts.Accelerators {
		if gpu.Vendor != "nvidia" || gpu.Model != "NVIDIA H100 80GB HBM3" || gpu.MemoryBytes != 81559<<20 || gpu.CUDAVersion != "12.4" || gpu.PCIBusID == "" {
			t.Fatalf("accelerator %+v is not the fixture's H100", gpu)
		}
	}
	return nodeID, facts.Accelerators
}

// gpuRun is a run spec asking for n GPUs and no CPU or memory, so it fits
// beside the others whatever this machine's size.
func gpuRun(n int, command ...string) api.RunSpec {
	return api.RunSpec{GPUs: n, GPUModel: "H100", Command: command}
}

func attemptGPUs(t *testing.T, run api.Run, want int) []string {
	t.Helper()
	if len(run.Attempts) == 0 {
		t.Fatalf("run %s has no attempt", run.ID)
	}
	gpus := run.Attempts[len(run.Attempts)-1].GPUs
	if len(gpus) != want {
		t.Fatalf("run %s got GPUs %v, want %d", run.ID, gpus, want)
	}
	return gpus
}

func disjoint(a, b []string) bool {
	for _, g := range a {
		if slices.Contains(b, g) {
			return false
		}
	}
	return true
}

func uuidsOf(gpus []nodeproto.Accelerator) []string {
	var uuids []string
	for _, g := range gpus {
		uuids = append(uuids, g.UUID)
	}
	return uuids
}

func subset(of []string, gpus []string) bool {
	for _, g := range gpus {
		if !slices.Contains(of, g) {
			return false
		}
	}
	return true
}

// containerEnv reads one variable from the environment the kernel holds for
// a container's main process. It is the only place the variable dockerd's
// NVIDIA driver adds can be seen in a running container: it is put in the
// OCI spec at start, not in the container's config, so neither inspect nor
// exec shows it. Reading another process's environment needs root, which
// the stand-in hook needs anyway.
func containerEnv(t *testing.T, containerID, name string) string {
	t.Helper()
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	info, err := cli.ContainerInspect(context.Background(), containerID)
	if err != nil || info.State == nil || info.State.Pid == 0 {
		t.Fatalf("inspect %s: %v (state %+v)", containerID, err, info.State)
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(info.State.Pid) + "/environ")
	if err != nil {
		t.Fatalf("environment of container %s: %v", containerID, err)
	}
	for _, kv := range strings.Split(string(raw), "\x00") {
		if value, ok := strings.CutPrefix(kv, name+"="); ok {
			return value
		}
	}
	return ""
}

// TestGPURuns stands in an 8×H100 machine (fake nvidia-smi, fake kernel
// report, the stand-in container hook) and checks what a user of GPU runs
// relies on: runs get disjoint devices by UUID, each container sees exactly
// the devices it was assigned in NVIDIA_VISIBLE_DEVICES, a run that needs
// more than is free waits saying so, and it is placed once devices free up.
func TestGPURuns(t *testing.T) {
	requireGPUHook(t)
	c := startCluster(t)

	// Both runs are queued before the node exists, so the first pass that
	// sees its GPUs places them together: one plan, disjoint devices. Each
	// prints the variable dockerd's NVIDIA driver sets from the request.
	first := c.submit(gpuRun(4, "env", "NVIDIA_VISIBLE_DEVICES"))
	second := c.submit(gpuRun(3, "env", "NVIDIA_VISIBLE_DEVICES"))
	nodeID, gpus := c.startGPUAgent(t)
	all := uuidsOf(gpus)

	t.Run("one plan hands out disjoint devices, and each container sees exactly its own", func(t *testing.T) {
		var assigned [][]string
		for _, run := range []struct {
			id   string
			want int
		}{{first.ID, 4}, {second.ID, 3}} {
			done := c.wait(run.id)
			if done.Status != api.RunSucceeded {
				t.Fatalf("run %s: %s (%s)", run.id, done.Status, done.Reason)
			}
			got := attemptGPUs(t, done, run.want)
			if done.Attempts[0].NodeID != nodeID || !subset(all, got) {
				t.Fatalf("run %s placed on %s with %v, want the fake machine's GPUs %v", run.id, done.Attempts[0].NodeID, got, all)
			}
			seen := strings.TrimSpace(c.logs(run.id))
			t.Logf("run %s: assigned %v, its container saw NVIDIA_VISIBLE_DEVICES=%s", run.id, got, seen)
			if seen != strings.Join(got, ",") {
				t.Errorf("run %s was assigned %v but its container saw NVIDIA_VISIBLE_DEVICES=%q", run.id, got, seen)
			}
			assigned = append(assigned, got)
		}
		if !disjoint(assigned[0], assigned[1]) {
			t.Errorf("the two runs share a GPU: %v and %v", assigned[0], assigned[1])
		}
	})

	t.Run("a run waits for free GPUs and is placed once some finish", func(t *testing.T) {
		holdA := c.submit(gpuRun(4, "sleep", "300"))
		holdB := c.submit(gpuRun(3, "sleep", "300"))
		var held [][]string
		for _, hold := range []struct {
			id   string
			want int
		}{{holdA.ID, 4}, {holdB.ID, 3}} {
			c.waitFor("run "+hold.id+" running", func() bool {
				r, err := c.client.GetRun(c.ctx, hold.id)
				return err == nil && r.Status == api.RunRunning
			})
			r, err := c.client.GetRun(c.ctx, hold.id)
			if err != nil {
				t.Fatal(err)
			}
			got := attemptGPUs(t, r, hold.want)
			seen := containerEnv(t, r.Attempts[0].ContainerID, "NVIDIA_VISIBLE_DEVICES")
			t.Logf("run %s: assigned %v, its running container has NVIDIA_VISIBLE_DEVICES=%s", r.ID, got, seen)
			if seen != strings.Join(got, ",") {
				t.Errorf("run %s was assigned %v but its container runs with NVIDIA_VISIBLE_DEVICES=%q", r.ID, got, seen)
			}
			held = append(held, got)
		}
		if !disjoint(held[0], held[1]) {
			t.Fatalf("the running runs share a GPU: %v and %v", held[0], held[1])
		}

		// One GPU is free and this needs four.
		waiting := c.submit(gpuRun(4, "env", "NVIDIA_VISIBLE_DEVICES"))
		var reason string
		c.waitFor("a reason naming too few free GPUs", func() bool {
			r, err := c.client.GetRun(c.ctx, waiting.ID)
			reason = r.Reason
			return err == nil && r.Status == api.RunQueued && strings.Contains(r.Reason, "too few free GPUs (need 4)")
		})
		t.Logf("run %s: %s", waiting.ID, reason)
		if r, _ := c.client.GetRun(c.ctx, waiting.ID); len(r.Attempts) != 0 {
			t.Fatalf("the waiting run was placed: %+v", r.Attempts)
		}

		if _, err := c.client.CancelRun(c.ctx, holdA.ID); err != nil {
			t.Fatal(err)
		}
		if done := c.wait(holdA.ID); done.Status != api.RunCancelled {
			t.Fatalf("holder %s: %s (%s)", holdA.ID, done.Status, done.Reason)
		}
		done := c.wait(waiting.ID)
		if done.Status != api.RunSucceeded {
			t.Fatalf("run %s: %s (%s)", waiting.ID, done.Status, done.Reason)
		}
		got := attemptGPUs(t, done, 4)
		if !disjoint(got, held[1]) || !subset(all, got) {
			t.Errorf("run %s got %v while %v were still held", waiting.ID, got, held[1])
		}
		seen := strings.TrimSpace(c.logs(waiting.ID))
		t.Logf("run %s: assigned %v once %s finished, its container saw NVIDIA_VISIBLE_DEVICES=%s", waiting.ID, got, holdA.ID, seen)
		if seen != strings.Join(got, ",") {
			t.Errorf("run %s was assigned %v but its container saw NVIDIA_VISIBLE_DEVICES=%q", waiting.ID, got, seen)
		}
		if _, err := c.client.CancelRun(c.ctx, holdB.ID); err != nil {
			t.Fatal(err)
		}
		c.wait(holdB.ID)
	})
}
