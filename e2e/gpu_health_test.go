package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/nodeproto"
)

// switchableMachine is a stand-in GPU machine whose vendor tool's answers
// the test changes while the agent runs, by writing the files the fake tool
// prints (testdata/gpu/fake-nvidia-smi); kmsg is its kernel log.
type switchableMachine struct {
	t    *testing.T
	dir  string
	kmsg string
	// rename maps the fixture's UUIDs to this machine's, so two stand-ins
	// of one fixture are two machines, not a GPU dispute.
	rename *strings.Replacer
}

// newSwitchableMachine copies the fixture machine (and the fake tool itself,
// which finds its answers beside it) into a directory of the test's, with
// every UUID's last digit replaced by suffix ("" keeps them).
func newSwitchableMachine(t *testing.T, fixture, suffix string) *switchableMachine {
	t.Helper()
	m := &switchableMachine{t: t, dir: t.TempDir()}
	m.kmsg = filepath.Join(m.dir, "kmsg")
	src := filepath.Join(repoRoot(t), "testdata", "gpu")
	var pairs []string
	if suffix != "" {
		q, err := os.ReadFile(filepath.Join(src, fixture, "query.csv"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(q)), "\n") {
			uuid := strings.TrimSpace(strings.Split(line, ",")[1])
			pairs = append(pairs, uuid, uuid[:len(uuid)-1]+suffix)
		}
	}
	m.rename = strings.NewReplacer(pairs...)
	m.copy(filepath.Join(src, "fake-nvidia-smi"), "nvidia-smi", 0o755)
	for _, f := range []string{"query.csv", "header.txt", "health.csv", "query.xml"} {
		m.copy(filepath.Join(src, fixture, f), f, 0o644)
	}
	if err := os.WriteFile(m.kmsg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return m
}

// copy writes src into the machine as name, with its UUIDs renamed.
func (m *switchableMachine) copy(src, name string, mode os.FileMode) {
	m.t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		m.t.Fatal(err)
	}
	m.write(name, m.rename.Replace(string(b)), mode)
}

// write replaces one of the machine's files whole (a new file renamed over
// the old), so the fake tool, which may be printing it at that moment,
// prints the old answer or the new one, never half of one: a half answer
// would be a tool leaving cards out, which the agent rightly takes for
// missing cards.
func (m *switchableMachine) write(name, text string, mode os.FileMode) {
	m.t.Helper()
	tmp := filepath.Join(m.dir, "."+name+".new")
	if err := os.WriteFile(tmp, []byte(text), mode); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, name)); err != nil {
		m.t.Fatal(err)
	}
}

// dropGPU makes the tool stop listing the GPU on the given line of the
// fixture, in both its facts and its health answers, as a card that fell
// off the bus without an Xid does (NVSentinel#155).
func (m *switchableMachine) dropGPU(fixture string, line int) {
	m.t.Helper()
	for _, f := range []string{"query.csv", "health.csv"} {
		b, err := os.ReadFile(filepath.Join(repoRoot(m.t), "testdata", "gpu", fixture, f))
		if err != nil {
			m.t.Fatal(err)
		}
		lines := strings.SplitAfter(string(b), "\n")
		lines = slices.Delete(lines, line, line+1)
		m.write(f, m.rename.Replace(strings.Join(lines, "")), 0o644)
	}
}

// restore puts the fixture's answers back.
func (m *switchableMachine) restore(fixture string) {
	m.t.Helper()
	for _, f := range []string{"query.csv", "health.csv"} {
		m.copy(filepath.Join(repoRoot(m.t), "testdata", "gpu", fixture, f), f, 0o644)
	}
}

// startSwitchableAgent starts an agent on the machine, sampling its GPUs
// every 200 ms, and waits until the control plane holds its eight GPUs.
func (c *cluster) startSwitchableAgent(t *testing.T, base string, m *switchableMachine) string {
	t.Helper()
	id := c.startAgentWith(base, func(o *daemon.AgentOptions) {
		o.AcceleratorTool = filepath.Join(m.dir, "nvidia-smi")
		o.KernelReports = fakeKernelReports(t, gpuMachine)
		o.KernelLog = m.kmsg
		o.GPUSampleEvery = 200 * time.Millisecond
	})
	c.waitFor("node "+id+" ready with 8 healthy GPUs", func() bool {
		n, err := c.client.GetNode(c.ctx, id)
		if err != nil || n.Status != api.NodeReady || len(n.GPUs) != 8 {
			return false
		}
		for _, g := range n.GPUs {
			if g.State != api.GPUStateHealthy || g.Reported != nodeproto.GPUHealthy {
				return false
			}
		}
		return true
	})
	return id
}

func gpuOf(n api.Node, uuid string) api.NodeGPU {
	for _, g := range n.GPUs {
		if g.UUID == uuid {
			return g
		}
	}
	return api.NodeGPU{}
}

// TestGPUDisappearsMidRun stands in two 8×H100 machines on one Docker
// daemon. A run holding all eight GPUs of the first loses one of them
// mid-run (the tool stops listing it): the attempt fails as gpu_failed,
// naming the card and the reason, the run is retried on the other machine
// though it has no retry budget, the card is quarantined (the first
// machine keeps serving with seven), and it is never placed on again, even
// once the tool lists it again, until an operator uncordons it.
func TestGPUDisappearsMidRun(t *testing.T) {
	requireGPUHook(t)
	c := startCluster(t)
	first := newSwitchableMachine(t, gpuMachine, "")
	second := newSwitchableMachine(t, gpuMachine, "0")
	nodeA := c.startSwitchableAgent(t, "gpua", first)

	run := c.submit(gpuRun(8, "sleep", "300"))
	c.waitFor("run "+run.ID+" running on "+nodeA, func() bool {
		r, err := c.client.GetRun(c.ctx, run.ID)
		return err == nil && r.Status == api.RunRunning
	})
	nodeB := c.startSwitchableAgent(t, "gpub", second)

	r, err := c.client.GetRun(c.ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	held := attemptGPUs(t, r, 8)
	const line = 5
	lost := strings.TrimSpace(strings.Split(strings.Split(string(mustRead(t, filepath.Join(first.dir, "query.csv"))), "\n")[line], ",")[1])
	if !slices.Contains(held, lost) {
		t.Fatalf("attempt holds %v, not the card about to go (%s)", held, lost)
	}
	first.dropGPU(gpuMachine, line)

	c.waitFor("the run retried on "+nodeB, func() bool {
		r, err = c.client.GetRun(c.ctx, run.ID)
		return err == nil && len(r.Attempts) == 2 && r.Attempts[1].NodeID == nodeB && r.Status == api.RunRunning
	})
	failed := r.Attempts[0]
	t.Logf("attempt 1: %s, failure %+v, error %q; run: %s", failed.Status, failed.Failure, failed.Error, r.Reason)
	if failed.Status != api.AttemptFailed || failed.Failure == nil || failed.Failure.Kind != api.AttemptFailureGPU ||
		failed.Failure.GPU != lost || failed.Failure.Reason != nodeproto.GPUReasonMissing {
		t.Fatalf("attempt 1 = %+v, want failed gpu_failed on %s for gpu_missing", failed, lost)
	}
	if r.Retries != 0 {
		t.Fatalf("the run asked for %d retries; this checks a retry with none", r.Retries)
	}

	n, err := c.client.GetNode(c.ctx, nodeA)
	if err != nil {
		t.Fatal(err)
	}
	if g := gpuOf(n, lost); g.State != api.GPUStateSick || g.Reason != nodeproto.GPUReasonMissing || g.Since.IsZero() || len(n.GPUs) != 8 {
		t.Fatalf("node %s GPU %s = %+v (of %d listed), want sick gpu_missing, still listed", nodeA, lost, g, len(n.GPUs))
	}
	listing := c.mercator("node", "gpu", "ls", nodeA)
	t.Logf("mercator node gpu ls %s:\n%s", nodeA, listing)
	if !strings.Contains(listing, lost) || !strings.Contains(listing, "gpu_missing") {
		t.Fatalf("node gpu ls does not show the sick card:\n%s", listing)
	}
	if ls := c.mercator("node", "ls"); !strings.Contains(ls, "7/8") {
		t.Fatalf("node ls does not count 7 of 8 GPUs usable on %s:\n%s", nodeA, ls)
	}

	// The card comes back (the tool lists it again, healthy): the node
	// says so, but it stays quarantined. A run needing all eight of a
	// machine cannot use the first (seven usable; the second is busy) and
	// waits.
	first.restore(gpuMachine)
	c.waitFor("node "+nodeA+" reporting "+lost+" healthy again", func() bool {
		n, err := c.client.GetNode(c.ctx, nodeA)
		return err == nil && gpuOf(n, lost).Reported == nodeproto.GPUHealthy
	})
	if n, _ := c.client.GetNode(c.ctx, nodeA); gpuOf(n, lost).State != api.GPUStateSick {
		t.Fatalf("the card left quarantine without an operator: %+v", gpuOf(n, lost))
	}
	waiting := c.submit(gpuRun(8, "env", "NVIDIA_VISIBLE_DEVICES"))
	c.waitFor("run "+waiting.ID+" waiting with a reason", func() bool {
		w, err := c.client.GetRun(c.ctx, waiting.ID)
		return err == nil && w.Status == api.RunQueued && strings.Contains(w.Reason, "GPU")
	})
	if w, _ := c.client.GetRun(c.ctx, waiting.ID); len(w.Attempts) != 0 {
		t.Fatalf("placed on a quarantined card: %+v", w.Attempts)
	} else {
		t.Logf("run %s waits: %s", waiting.ID, w.Reason)
	}

	// The operator uncordons the card: the waiting run gets all eight.
	c.mercator("node", "gpu", "uncordon", nodeA, lost)
	done := c.wait(waiting.ID)
	got := attemptGPUs(t, done, 8)
	if done.Status != api.RunSucceeded || done.Attempts[0].NodeID != nodeA || !slices.Contains(got, lost) {
		t.Fatalf("after uncordon: run %s %s on %s with %v, want succeeded on %s with %s", done.ID, done.Status, done.Attempts[0].NodeID, got, nodeA, lost)
	}
	if _, err := c.client.CancelRun(c.ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	c.wait(run.ID)
}

// TestGPUUsagePerAttempt: while an attempt runs, its node samples its two
// GPUs and reports a summary with its observations: `run get` shows the
// average and peak of each (the stand-in tool's figures for those cards),
// the control plane serves the busy GPUs' last figures as Prometheus
// metrics by node and GPU, an application Xid on one of its cards is filed
// against the attempt (the card stays healthy), and the series go when the
// attempt ends, whose final summary stays on the attempt.
func TestGPUUsagePerAttempt(t *testing.T) {
	requireGPUHook(t)
	c := startCluster(t)
	m := newSwitchableMachine(t, gpuMachine, "")
	nodeID := c.startSwitchableAgent(t, "gpuu", m)
	want := map[string][]string{} // UUID → its health.csv fields
	for _, line := range strings.Split(strings.TrimSpace(string(mustRead(t, filepath.Join(m.dir, "health.csv")))), "\n") {
		f := strings.Split(line, ", ")
		want[f[0]] = f
	}

	run := c.submit(gpuRun(2, "sleep", "300"))
	var r api.Run
	c.waitFor("run "+run.ID+" reporting GPU usage while it runs", func() bool {
		var err error
		r, err = c.client.GetRun(c.ctx, run.ID)
		return err == nil && r.Status == api.RunRunning && len(r.Attempts[0].GPUUsage) == 2
	})
	for _, u := range r.Attempts[0].GPUUsage {
		f := want[u.UUID]
		if f == nil || u.Samples == 0 || u.UtilAvg != number(t, f[2]) || u.UtilPeak != number(t, f[2]) || u.MemoryPeakMiB != number(t, f[3]) || u.PowerPeakW != number(t, f[4]) {
			t.Fatalf("usage %+v, want the tool's figures %v", u, f)
		}
	}
	metrics := c.get("/metrics")
	series := `mercator_gpu_utilization_percent{gpu="` + r.Attempts[0].GPUUsage[0].UUID + `",node="` + nodeID + `"}`
	if !strings.Contains(metrics, series) {
		t.Fatalf("/metrics lacks %s", series)
	}
	if !strings.Contains(metrics, `mercator_gpus{state="healthy"}`) {
		t.Fatal("/metrics lacks the GPU state gauge")
	}
	out := c.mercator("run", "get", run.ID)
	t.Logf("mercator run get %s:\n%s", run.ID, out)
	if !strings.Contains(out, "UTIL AVG/PEAK") || !strings.Contains(out, r.Attempts[0].GPUUsage[0].UUID) {
		t.Fatalf("run get shows no GPU usage:\n%s", out)
	}

	// The program faults on its first GPU (Xid 13 in the kernel log): the
	// Xid is filed against the attempt, and the card stays healthy.
	held := r.Attempts[0].GPUs[0]
	bus := ""
	for _, line := range strings.Split(string(mustRead(t, filepath.Join(m.dir, "query.csv"))), "\n") {
		if f := strings.Split(line, ", "); len(f) == 5 && f[1] == held {
			bus = strings.ToLower(f[4][4:14]) // "00000000:18:00.0" → "0000:18:00"
		}
	}
	appendFile(t, m.kmsg, "4,2041,104830221874,-;NVRM: Xid (PCI:"+bus+"): 13, pid=48213, name=python3, Graphics Exception: ESR 0x50dfb0=0x1011e\n")
	c.waitFor("Xid 13 filed against the attempt", func() bool {
		r, err := c.client.GetRun(c.ctx, run.ID)
		return err == nil && len(r.Attempts[0].Xids) == 1 && r.Attempts[0].Xids[0].GPU == held && r.Attempts[0].Xids[0].Xid == 13
	})
	if n, _ := c.client.GetNode(c.ctx, nodeID); gpuOf(n, held).State != api.GPUStateHealthy {
		t.Fatalf("an application Xid made the card %+v", gpuOf(n, held))
	}

	if _, err := c.client.CancelRun(c.ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	done := c.wait(run.ID)
	if len(done.Attempts[0].GPUUsage) != 2 || done.Attempts[0].GPUUsage[0].Samples < r.Attempts[0].GPUUsage[0].Samples {
		t.Fatalf("the ended attempt's usage %+v", done.Attempts[0].GPUUsage)
	}
	c.waitFor("the GPU's series gone once its attempt ended", func() bool {
		return !strings.Contains(c.get("/metrics"), series)
	})
}

// number is a figure the stand-in tool prints.
func number(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}
