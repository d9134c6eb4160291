package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/nodeproto"
)

// runGPUAgent runs an agent with options until the returned stop is called
// (which waits for it to end), so a test can start it again on its state.
func (c *cluster) runGPUAgent(options daemon.AgentOptions) (stop func()) {
	c.t.Helper()
	ctx, cancel := context.WithCancel(c.ctx)
	done := make(chan struct{})
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(done)
		if err := daemon.RunAgent(ctx, options); err != nil && ctx.Err() == nil {
			c.t.Errorf("agent %s stopped: %v", options.NodeID, err)
		}
	}()
	return func() { cancel(); <-done }
}

// TestGPUDiagAndKeptInventory stands in an 8×H100 machine with DCGM: a
// stand-in dcgmi on PATH (testdata/gpu/fake-dcgmi) answers the agent's
// `dcgmi diag -r 1 -j` with DCGM 4's JSON failing GPU 3 (row remaps
// pending) and warning of GPU 5 (persistence mode off). GPU 3, and only it,
// is quarantined with reason diag_failed and shown by node gpu ls; an
// uncordon returns it. Then the agent stops, GPU 6 vanishes while it is
// down, and the agent started again on its state still lists GPU 6, as
// missing, and the control plane quarantines it.
func TestGPUDiagAndKeptInventory(t *testing.T) {
	c := startCluster(t)
	m := newSwitchableMachine(t, gpuMachine, "")
	src := filepath.Join(repoRoot(t), "testdata", "gpu")
	m.copy(filepath.Join(src, "fake-dcgmi"), "dcgmi", 0o755)
	m.copy(filepath.Join(src, "dcgm", "dcgm4-r1-fail.json"), "diag.out", 0o644)
	m.write("diag.status", "205", 0o644) // DCGM_ST_NVVS_ISOLATE_ERROR (-51)
	t.Setenv("PATH", m.dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	var uuids []string
	for _, line := range strings.Split(strings.TrimSpace(string(mustRead(t, filepath.Join(m.dir, "query.csv")))), "\n") {
		uuids = append(uuids, strings.TrimSpace(strings.Split(line, ",")[1]))
	}

	id := uniqueNodeID(t, "diag")
	inv, err := c.client.InviteNode(c.ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	options := daemon.AgentOptions{
		ControlPlaneURL: c.url, NodeID: id, StateDir: filepath.Join(c.dataDir, "agent-"+id),
		Invitation: inv.Token, Heartbeat: time.Second, Logger: testLogger(t).With("c", "agent", "node", id),
		AcceleratorTool: filepath.Join(m.dir, "nvidia-smi"), KernelReports: fakeKernelReports(t, gpuMachine), KernelLog: m.kmsg,
		GPUSampleEvery: 200 * time.Millisecond, DCGMI: "dcgmi", GPUDiagEvery: -1,
	}
	stop := c.runGPUAgent(options)

	var n api.Node
	c.waitFor("GPU 3 quarantined by the diagnostic", func() bool {
		n, err = c.client.GetNode(c.ctx, id)
		return err == nil && len(n.GPUs) == 8 && gpuOf(n, uuids[3]).State == api.GPUStateSick
	})
	g := gpuOf(n, uuids[3])
	if g.Reason != nodeproto.GPUReasonDiag || !strings.Contains(g.Detail, "row remappings are pending") {
		t.Fatalf("GPU 3 = %+v, want diag_failed quoting DCGM", g)
	}
	for i, u := range uuids {
		if i != 3 && gpuOf(n, u).State != api.GPUStateHealthy {
			t.Errorf("GPU %d = %+v, want healthy (GPU 5's persistence mode is a warning)", i, gpuOf(n, u))
		}
	}
	c.waitFor("GPU 5's warning among the node's notes", func() bool {
		n, err = c.client.GetNode(c.ctx, id)
		if err != nil || n.Facts == nil {
			return false
		}
		notes, _ := (*n.Facts)["notes"].([]any)
		for _, note := range notes {
			if s, _ := note.(string); strings.Contains(s, uuids[5]) && strings.Contains(s, "Persistence mode") {
				return true
			}
		}
		return false
	})
	listing := c.mercator("node", "gpu", "ls", id)
	t.Logf("mercator node gpu ls %s:\n%s", id, listing)
	if !strings.Contains(listing, uuids[3]) || !strings.Contains(listing, nodeproto.GPUReasonDiag) {
		t.Fatalf("node gpu ls does not show the failed card:\n%s", listing)
	}
	c.mercator("node", "gpu", "uncordon", id, uuids[3])
	c.waitFor("GPU 3 returned by the uncordon", func() bool {
		n, err = c.client.GetNode(c.ctx, id)
		return err == nil && gpuOf(n, uuids[3]).State == api.GPUStateHealthy
	})

	// GPU 6 vanishes while the agent is down; the diagnostic is off now.
	stop()
	m.dropGPU(gpuMachine, 6)
	options.Invitation, options.DCGMI = "", ""
	stop = c.runGPUAgent(options)
	defer stop()
	c.waitFor("GPU 6 reported missing after the restart", func() bool {
		n, err = c.client.GetNode(c.ctx, id)
		return err == nil && len(n.GPUs) == 8 && gpuOf(n, uuids[6]).State == api.GPUStateSick
	})
	if g := gpuOf(n, uuids[6]); g.Reason != nodeproto.GPUReasonMissing {
		t.Fatalf("GPU 6 = %+v, want quarantined as gpu_missing", g)
	}
}
