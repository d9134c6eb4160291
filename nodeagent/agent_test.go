package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeagent/runtimesim"
	"github.com/mercator/mercator/nodeproto"
)

// chanTransport hands the agent the commands a test pushes and records the
// events it delivers.
type chanTransport struct {
	commands chan nodeproto.Command
	mu       sync.Mutex
	events   []nodeproto.Event
	offline  bool
}

func (c *chanTransport) Enroll(context.Context, nodeproto.EnrollmentRequest) (nodeproto.Enrollment, error) {
	return nodeproto.Enrollment{SessionToken: "s", ExpiresAt: time.Now().Add(time.Hour), FencingToken: 5}, nil
}
func (c *chanTransport) RenewSession(context.Context, string, string) (nodeproto.SessionRenewal, error) {
	return nodeproto.SessionRenewal{SessionToken: "s2", ExpiresAt: time.Now().Add(time.Hour), FencingToken: 5}, nil
}
func (c *chanTransport) Session(ctx context.Context, _, _ string, out chan<- nodeproto.Command) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case cmd := <-c.commands:
			out <- cmd
		}
	}
}
func (c *chanTransport) SendEvents(_ context.Context, _, _ string, evs []nodeproto.Event) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.offline {
		return nil, failure.Unavailable("partitioned")
	}
	var ids []string
	for _, e := range evs {
		c.events = append(c.events, e)
		ids = append(ids, e.ID)
	}
	return ids, nil
}
func (c *chanTransport) SendLogs(context.Context, string, string, nodeproto.LogChunk) (nodeproto.LogAck, error) {
	return nodeproto.LogAck{}, nil
}

func (c *chanTransport) results(op string) []nodeproto.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []nodeproto.Event
	for _, e := range c.events {
		if e.Kind == nodeproto.EventResult && e.Result.OperationID == op {
			out = append(out, e)
		}
	}
	return out
}

// exitReported says whether an exit of key was delivered.
func (c *chanTransport) exitReported(key nodeproto.WorkloadKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.events {
		if e.Kind == nodeproto.EventWorkload && e.Workload.WorkloadKey == key && e.Workload.Phase == nodeproto.PhaseExited {
			return true
		}
	}
	return false
}

func startTestAgent(t *testing.T, rt Runtime, tr Transport, dir string, options ...Option) (stop func()) {
	state, err := OpenState(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	options = append([]Option{WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), WithObserveInterval(20 * time.Millisecond), WithReconnectBackoff(10 * time.Millisecond)}, options...)
	a := New(Identity{NodeID: "n1", EnrollmentToken: "inv"}, rt, tr, state, options...)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("agent: %v", err)
		}
		state.Close()
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func launch(op string, fence uint64) nodeproto.Command {
	return nodeproto.Command{OperationID: op, FencingToken: fence, Kind: nodeproto.KindLaunchWorkload,
		LaunchWorkload: &nodeproto.LaunchWorkloadCommand{WorkloadKey: nodeproto.WorkloadKey{RunID: "r-" + op, Attempt: 1}, Image: pinnedImage("x")}}
}

// TestRedeliveredLaunchStartsOneContainer: the same command delivered many
// times, across an agent restart, launches once and is answered with the
// same result event each time.
func TestRedeliveredLaunchStartsOneContainer(t *testing.T) {
	rt, tr, dir := newMemRuntime(), &chanTransport{commands: make(chan nodeproto.Command)}, t.TempDir()
	stop := startTestAgent(t, rt, tr, dir)
	cmd := launch("op1", 5)
	for i := 0; i < 5; i++ {
		tr.commands <- cmd
		waitUntil(t, fmt.Sprintf("answer %d (have %d)", i+1, len(tr.results("op1"))), func() bool { return len(tr.results("op1")) >= i+1 })
	}
	stop()
	stop = startTestAgent(t, rt, tr, dir)
	defer stop()
	tr.commands <- cmd
	waitUntil(t, "an answer after restart", func() bool { return len(tr.results("op1")) >= 6 })
	res := tr.results("op1")
	for _, e := range res {
		if e.ID != res[0].ID || e.Result.Outcome != nodeproto.OutcomeOK {
			t.Fatalf("answers differ: %+v vs %+v", e, res[0])
		}
	}
	if n := rt.creates(cmd.LaunchWorkload.WorkloadKey); n != 1 {
		t.Fatalf("%d creates asked of the daemon, want 1", n)
	}
}

// gatedPrepare is a memRuntime whose PrepareImage for one run waits until
// the test opens the gate: a pull that takes a while.
type gatedPrepare struct {
	*memRuntime
	run  string
	gate chan struct{}
}

func (g *gatedPrepare) PrepareImage(ctx context.Context, c nodeproto.PrepareImageCommand) error {
	if strings.Contains(c.Image, g.run) {
		select {
		case <-g.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.memRuntime.PrepareImage(ctx, c)
}

// phases is the workload phases delivered for run, in delivery order, with
// "result" where the launch's result was.
func (c *chanTransport) phases(run string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, e := range c.events {
		switch {
		case e.Kind == nodeproto.EventWorkload && e.Workload.RunID == run:
			out = append(out, string(e.Workload.Phase))
		case e.Kind == nodeproto.EventResult && e.Result.Workload != nil && e.Result.Workload.RunID == run:
			out = append(out, "result")
		}
	}
	return out
}

// TestPreparingReportedOnlyForSlowLaunches: a launch that ends quickly is
// reported by its result and the running observation alone; one that is
// still preparing its image after preparingAfter is reported as preparing
// first, and its result and running observation come after.
func TestPreparingReportedOnlyForSlowLaunches(t *testing.T) {
	rt := &gatedPrepare{memRuntime: newMemRuntime(), run: "slow", gate: make(chan struct{})}
	tr := &chanTransport{commands: make(chan nodeproto.Command)}
	stop := startTestAgent(t, rt, tr, t.TempDir(), func(a *Agent) { a.preparingAfter = 50 * time.Millisecond })
	defer stop()

	fast, slow := launch("fast", 5), launch("slow", 5)
	slow.LaunchWorkload.Image = pinnedImage("slow")
	tr.commands <- fast
	// The result and the running observation are independent facts (the
	// observation may even be made first); what must not be there is a
	// preparing report.
	reported := func(run string) bool {
		p := tr.phases(run)
		return slices.Contains(p, "running") && slices.Contains(p, "result")
	}
	waitUntil(t, "the fast launch's result and running observation", func() bool { return reported("r-fast") })
	if got := tr.phases("r-fast"); len(got) != 2 {
		t.Fatalf("fast launch reported %v, want the result and running only", got)
	}

	tr.commands <- slow
	waitUntil(t, "the slow launch's preparing observation", func() bool { return len(tr.phases("r-slow")) > 0 })
	close(rt.gate)
	waitUntil(t, "the slow launch's result and running observation", func() bool { return reported("r-slow") })
	if got := tr.phases("r-slow"); len(got) != 3 || got[0] != "preparing" {
		t.Fatalf("slow launch reported %v, want preparing, then the result and running", got)
	}
}

// TestFencedCommandRefused: a command fenced below the node's token is
// refused, in a result that says so, and not performed.
func TestFencedCommandRefused(t *testing.T) {
	rt, tr := newMemRuntime(), &chanTransport{commands: make(chan nodeproto.Command)}
	defer startTestAgent(t, rt, tr, t.TempDir())()
	cmd := launch("old", 4) // the node holds token 5
	tr.commands <- cmd
	waitUntil(t, "a refusal", func() bool { return len(tr.results("old")) == 1 })
	r := tr.results("old")[0].Result
	if r.Outcome != nodeproto.OutcomeRefused || r.Error == "" {
		t.Fatalf("result %+v, want refused with a reason", r)
	}
	if rt.creates(cmd.LaunchWorkload.WorkloadKey) != 0 {
		t.Fatal("fenced command was performed")
	}
}

// TestSpoolSurvivesPartition: what is observed while the control plane is
// unreachable is delivered afterwards, with the IDs it was minted with.
func TestSpoolSurvivesPartition(t *testing.T) {
	rt, tr := newMemRuntime(), &chanTransport{commands: make(chan nodeproto.Command), offline: true}
	defer startTestAgent(t, rt, tr, t.TempDir())()
	tr.commands <- launch("op1", 5)
	time.Sleep(100 * time.Millisecond)
	if len(tr.results("op1")) != 0 {
		t.Fatal("delivered while offline")
	}
	tr.mu.Lock()
	tr.offline = false
	tr.mu.Unlock()
	waitUntil(t, "the result after the partition", func() bool { return len(tr.results("op1")) == 1 })
	waitUntil(t, "the running observation", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for _, e := range tr.events {
			if e.Kind == nodeproto.EventWorkload && e.Workload.Phase == nodeproto.PhaseRunning {
				return true
			}
		}
		return false
	})
}

// TestUnavailableRuntimeIsRetried: a launch that meets a restarting daemon
// is retried, not reported as the run's failure.
func TestUnavailableRuntimeIsRetried(t *testing.T) {
	rt, tr := newMemRuntime(), &chanTransport{commands: make(chan nodeproto.Command)}
	rt.failPulls = 2
	defer startTestAgent(t, rt, tr, t.TempDir())()
	tr.commands <- launch("op1", 5)
	waitUntil(t, "a result", func() bool { return len(tr.results("op1")) == 1 })
	if r := tr.results("op1")[0].Result; r.Outcome != nodeproto.OutcomeOK {
		t.Fatalf("result %+v, want ok after retries", r)
	}
}

// startLaterRuntime launches workloads into the created phase and starts
// them when the test says, and serves logs as the Docker daemon does: a
// follow of a container that has not started ends at once with nothing.
// (the Docker runtime refuses that follow; this runtime does not, so the test
// checks that the agent does not ask before the workload runs.)
type startLaterRuntime struct {
	*memRuntime
	output string
}

func (m *startLaterRuntime) LaunchWorkload(ctx context.Context, c nodeproto.LaunchWorkloadCommand) error {
	if err := m.memRuntime.LaunchWorkload(ctx, c); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.workloads[c.WorkloadKey].created = true
	return nil
}

// runToExit moves key from created through running to exited.
func (m *startLaterRuntime) runToExit(key nodeproto.WorkloadKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.workloads[key]
	w.created, w.c = false, runtimesim.Container{Program: runtimesim.Program{Known: true}, Started: time.Now()}
}

func (m *startLaterRuntime) Logs(_ context.Context, key nodeproto.WorkloadKey, _ bool) (io.ReadCloser, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.workloads[key].created {
		return io.NopCloser(strings.NewReader("")), nil
	}
	return io.NopCloser(strings.NewReader(m.output)), nil
}

// logTransport records the log chunks it is sent.
type logTransport struct {
	*chanTransport
	logMu sync.Mutex
	logs  map[nodeproto.WorkloadKey]string
}

func (l *logTransport) SendLogs(_ context.Context, _, _ string, c nodeproto.LogChunk) (nodeproto.LogAck, error) {
	l.logMu.Lock()
	defer l.logMu.Unlock()
	have := l.logs[c.WorkloadKey]
	if c.Offset == int64(len(have)) {
		l.logs[c.WorkloadKey] = have + string(c.Data)
	}
	return nodeproto.LogAck{}, nil
}

func (l *logTransport) shipped(key nodeproto.WorkloadKey) string {
	l.logMu.Lock()
	defer l.logMu.Unlock()
	return l.logs[key]
}

// TestLogsOfAWorkloadObservedBeforeItStarted: a workload seen in the created
// phase (a slow start under load) still has its whole output shipped once
// it runs, and before its exit is reported.
func TestLogsOfAWorkloadObservedBeforeItStarted(t *testing.T) {
	rt := &startLaterRuntime{memRuntime: newMemRuntime(), output: "hello from the workload\n"}
	tr := &logTransport{chanTransport: &chanTransport{commands: make(chan nodeproto.Command, 4)}, logs: map[nodeproto.WorkloadKey]string{}}
	stop := startTestAgent(t, rt, tr, t.TempDir())
	defer stop()
	cmd := launch("op1", 5)
	tr.commands <- cmd
	key := cmd.LaunchWorkload.WorkloadKey
	waitUntil(t, "the launch result", func() bool { return len(tr.results("op1")) > 0 })
	time.Sleep(100 * time.Millisecond) // several observations of the created workload
	rt.runToExit(key)
	waitUntil(t, "the exit reported", func() bool { return tr.exitReported(key) })
	if got := tr.shipped(key); got != rt.output {
		t.Errorf("logs shipped by the time the exit was reported = %q, want %q", got, rt.output)
	}
}

// heartbeatTransport is chanTransport that refuses the first heartbeats
// (empty event batches) and signals every one tried.
type heartbeatTransport struct {
	chanTransport
	refuse atomic.Int32
	tried  chan struct{}
}

func (h *heartbeatTransport) SendEvents(ctx context.Context, node, tok string, evs []nodeproto.Event) ([]string, error) {
	if len(evs) == 0 {
		select {
		case h.tried <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if h.refuse.Add(-1) >= 0 {
			return nil, failure.Unavailable("the control plane is full")
		}
	}
	return h.chanTransport.SendEvents(ctx, node, tok, evs)
}

// TestFailedHeartbeatRetriedWithinThePeriod: a heartbeat the control plane
// did not take is tried again after the reconnect backoff, not a whole
// heartbeat period later (an hour here: the test would time out), so a node
// that met a full server when every node reconnected at once does not let
// its lease lapse.
func TestFailedHeartbeatRetriedWithinThePeriod(t *testing.T) {
	tr := &heartbeatTransport{chanTransport: chanTransport{commands: make(chan nodeproto.Command)}, tried: make(chan struct{})}
	tr.refuse.Store(3)
	stop := startTestAgent(t, newMemRuntime(), tr, t.TempDir(), WithHeartbeat(time.Hour))
	defer stop()
	for i := 0; i < 4; i++ { // three refused, then one taken
		<-tr.tried
	}
	select {
	case <-tr.tried:
		t.Fatal("a heartbeat was sent again before the period after one was taken")
	case <-time.After(100 * time.Millisecond):
	}
}
