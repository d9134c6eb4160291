package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/internal/faultproxy"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/nodeagent"
)

// Where a kill of the agent can land on the launch path, in order.
const (
	windowNotSent    = "launch not yet on the wire"
	windowNoContainr = "launch sent, no container yet"
	windowCreated    = "container created, not started"
	windowStarted    = "container started, not yet marked applied"
	windowApplied    = "marked applied, result not acknowledged"
	windowAcked      = "result acknowledged"
	windowNoCtrApp   = "marked applied without a container"
)

var windows = []string{windowNotSent, windowNoContainr, windowCreated, windowStarted, windowApplied, windowAcked, windowNoCtrApp}

// TestAgentKilledDuringLaunch kills the agent with SIGKILL at random points
// of the launch path, many times, and restarts it on the same state. The
// kill is timed from the launch command going down the session (0–300ms
// later) or from the daemon's own create or start event for the container
// (a few milliseconds later, or a SIGSTOP at once and the kill after), the
// latter to land between the container's creation and the agent's durable
// MarkApplied. Each kill is classified by where it landed, from the
// daemon's view and the dead agent's state file, and the counts are
// printed.
//
// The window between creation and MarkApplied is the one the test exists
// for, and a random kill can miss it: after the random trials, SIGSTOP
// trials are added until at least minInWindow kills landed in it, and the
// test fails if a bounded number of them never does, rather than pass
// without having exercised it.
//
// What it proves (docs/design.md, promise 1, across a crash): the restarted
// agent, handed the still-pending launch again, adopts the container the
// daemon already has under the attempt's name (starting it if it was only
// created) rather than creating a second, and the run ends as the daemon
// says.
func TestAgentKilledDuringLaunch(t *testing.T) {
	c := newCluster(t, clusterOptions{})
	a := c.addAgent("n")
	ev := c.followEvents(a.node)
	landed := map[string]int{}
	inWindow := func() int { return landed[windowCreated] + landed[windowStarted] }
	for range trials(10, 50) {
		c.killDuringLaunch(a, ev, c.rng.IntN(4), landed)
	}
	minInWindow, extra := trials(1, 5), trials(15, 40)
	for i := 0; inWindow() < minInWindow; i++ {
		if i == extra {
			t.Fatalf("%d kills landed between container creation and MarkApplied after %d extra SIGSTOP trials, want at least %d (seed %d)", inWindow(), extra, minInWindow, seed)
		}
		c.killDuringLaunch(a, ev, 3, landed)
	}
	for _, w := range windows {
		if n := landed[w]; n > 0 {
			c.sum.fault("  run in flight at the kill: "+w, n)
		}
	}
	c.finish()
}

// killDuringLaunch is one trial of TestAgentKilledDuringLaunch: it submits
// one or two runs, kills the agent at the point kind chooses on one's launch
// path, counts where each run was in landed, and restarts the agent.
func (c *cluster) killDuringLaunch(a *agent, ev *daemonEvents, kind int, landed map[string]int) {
	t := c.t
	t.Helper()
	var runs []api.Run
	for range 1 + c.rng.IntN(2) {
		runs = append(runs, c.mustSubmit(api.RunSpec{Command: c.randomCommand()}))
	}
	target := runs[c.rng.IntN(len(runs))]
	switch kind {
	case 0:
		c.waitFor("the launch of "+target.ID+" on the wire", 30*time.Second, func() bool {
			_, ok := a.wire.launchFor(target.ID, 1)
			return ok
		})
		time.Sleep(uniform(c.rng, 0, 300*time.Millisecond))
		c.sum.fault("agent kill -9, 0-300ms after the launch was sent", 1)
	case 1:
		if !ev.wait(target.ID, 1, "create", 30*time.Second) {
			t.Fatalf("the daemon never created a container for %s", target.ID)
		}
		time.Sleep(uniform(c.rng, 0, 30*time.Millisecond))
		c.sum.fault("agent kill -9, 0-30ms after the daemon's create event", 1)
	case 2:
		if !ev.wait(target.ID, 1, "start", 30*time.Second) {
			t.Fatalf("the daemon never started a container for %s", target.ID)
		}
		time.Sleep(uniform(c.rng, 0, 10*time.Millisecond))
		c.sum.fault("agent kill -9, 0-10ms after the daemon's start event", 1)
	case 3:
		// SIGSTOP the moment the daemon says "create": the agent is
		// frozen before it asks for the start more often than not.
		if !ev.wait(target.ID, 1, "create", 30*time.Second) {
			t.Fatalf("the daemon never created a container for %s", target.ID)
		}
		a.proc.pause()
		c.sum.fault("agent SIGSTOP at the daemon's create event, then kill -9", 1)
	}
	a.kill()
	st := a.openState()
	for _, r := range runs {
		landed[c.classify(a, st, r.ID)]++
	}
	st.Close()
	since := time.Now()
	a.start()
	a.waitSession(since)
}

// classify says where on the launch path a run's first attempt was when
// its agent died, from the wire, the daemon and the agent's state file.
func (c *cluster) classify(a *agent, st *nodeagent.State, runID string) string {
	cmd, ok := a.wire.launchFor(runID, 1)
	if !ok {
		return windowNotSent
	}
	ct, has := c.containerOf(runID, 1)
	ev, applied := st.AppliedResult(cmd.cmd.OperationID)
	switch {
	case !has && !applied:
		return windowNoContainr
	case !has:
		return windowNoCtrApp
	case !applied && ct.status == "created":
		return windowCreated
	case !applied:
		return windowStarted
	case a.wire.events().acked[ev.ID]:
		return windowAcked
	}
	return windowApplied
}

// TestRedeliveryStorm makes every pending command arrive many times. While
// the storm lasts, each session stream is cut right after it carries a
// command, and every event batch the agent sends (results and observations;
// not bare heartbeats) is refused by the proxy, so no operation's result
// reaches the control plane and each new session redelivers everything
// pending: launches, and the stops of runs cancelled during the storm. Then
// the agent is killed and restarted over and over while new runs arrive.
//
// What it proves (docs/design.md, promise 1, against redelivery): however often a command
// arrives, on a live agent or a restarted one, it is performed once: one
// container per attempt, one result event per operation per agent memory
// (a second one would mean the operation was performed again), and the
// control plane applies each of those events once.
func TestRedeliveryStorm(t *testing.T) {
	c := newCluster(t, clusterOptions{})
	a := c.addAgent("n")
	var storming atomic.Bool
	var cuts atomic.Int64
	heartbeat := []byte(`"events":[]`)
	a.wire.setFilter(func(p []byte) faultproxy.Verdict {
		if storming.Load() && bytes.HasPrefix(p, []byte("POST "+nodeproto.PathEvents)) && !bytes.Contains(p, heartbeat) {
			return faultproxy.Close
		}
		return faultproxy.Forward
	})
	a.wire.setOnCommand(func(conn uint64, cmd nodeproto.Command) {
		if storming.Load() && a.proxy.CloseConn(conn) {
			cuts.Add(1)
		}
	})

	// Phase 1: a storm of session cuts with results held back.
	storming.Store(true)
	stormStart := time.Now()
	var runs, toCancel []api.Run
	for range trials(4, 10) {
		runs = append(runs, c.mustSubmit(api.RunSpec{Command: c.randomCommand()}))
	}
	for range trials(2, 4) {
		r := c.mustSubmit(api.RunSpec{Command: []string{"sleep", "60"}})
		runs, toCancel = append(runs, r), append(toCancel, r)
	}
	want := trials(4, 6)
	minDeliveries := func() int {
		d := a.wire.deliveries()
		least := -1
		for _, r := range runs {
			cmd, ok := a.wire.launchFor(r.ID, 1)
			if !ok {
				return 0
			}
			if n := d[cmd.cmd.OperationID]; least < 0 || n < least {
				least = n
			}
		}
		return least
	}
	c.waitFor("every launch delivered twice", 60*time.Second, func() bool { return minDeliveries() >= 2 })
	for _, r := range toCancel {
		ctx, cancel := withTimeout(30 * time.Second)
		if _, err := c.client.CancelRun(ctx, r.ID); err != nil {
			t.Fatalf("cancel %s: %v", r.ID, err)
		}
		cancel()
	}
	deadline := time.Now().Add(time.Duration(trials(25, 60)) * time.Second)
	for minDeliveries() < want && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	storming.Store(false)
	c.sum.fault(fmt.Sprintf("session streams cut right after a command (%.0fs, results held)", time.Since(stormStart).Seconds()), int(cuts.Load()))
	d := a.wire.deliveries()
	kinds := a.wire.commandKinds()
	most, total, redelivered := 0, 0, map[string]int{}
	for op, n := range d {
		total += n
		most = max(most, n)
		if n > 1 {
			redelivered[kinds[op]]++
		}
	}
	c.sum.fault(fmt.Sprintf("  command deliveries: %d operations, %d deliveries, at most %d of one", len(d), total, most), total)
	for _, k := range []string{nodeproto.KindLaunchWorkload, nodeproto.KindStopWorkload} {
		c.sum.fault("  operations delivered more than once: "+k, redelivered[k])
	}
	if minDeliveries() < want {
		c.sum.note("some launch was delivered fewer than %d times before the storm's time ran out", want)
	}

	// Phase 2: the agent restarted over and over while runs arrive.
	for range trials(3, 8) {
		c.mustSubmit(api.RunSpec{Command: c.randomCommand()})
	}
	restarts := trials(6, 20)
	var since time.Time
	for range restarts {
		time.Sleep(uniform(c.rng, 50*time.Millisecond, 700*time.Millisecond))
		a.kill()
		since = time.Now()
		a.start()
	}
	a.waitSession(since)
	c.sum.fault("agent kill -9 and restart, 50-700ms apart", restarts)
	c.finish()
}

// TestConnectionFlaps breaks the agent's connection at random while runs
// keep arriving: cut (every connection closed, new ones reset), blackholed
// (held, nothing forwarded, then released) or slowed, for random spells.
// Then it freezes the open connections silently, the half-dead connection
// only an application keep-alive can detect, and submits a run whose launch
// goes down the dead session.
//
// What it proves (docs/design.md, promise 2): everything the node observed while cut off is
// reported afterwards, with the daemon's moments, exactly once; and a
// silent session is abandoned by the agent's keep-alive timeout, after
// which the pending launch is redelivered and runs.
func TestConnectionFlaps(t *testing.T) {
	c := newCluster(t, clusterOptions{})
	a := c.addAgent("n")
	stop := c.submitLoop(200*time.Millisecond, 700*time.Millisecond)
	end := time.Now().Add(time.Duration(trials(20, 120)) * time.Second)
	for time.Now().Before(end) {
		switch c.rng.IntN(4) {
		case 0, 1:
			a.proxy.Cut()
			time.Sleep(uniform(c.rng, 100*time.Millisecond, 2500*time.Millisecond))
			a.proxy.Restore()
			c.sum.fault("connection cut (closed, new ones reset) for 0.1-2.5s", 1)
		case 2:
			a.proxy.Blackhole()
			time.Sleep(uniform(c.rng, 100*time.Millisecond, 3*time.Second))
			a.proxy.Restore()
			c.sum.fault("connection blackholed (held, nothing forwarded) for 0.1-3s", 1)
		case 3:
			a.proxy.SetDelay(uniform(c.rng, 10*time.Millisecond, 300*time.Millisecond))
			time.Sleep(uniform(c.rng, 500*time.Millisecond, 3*time.Second))
			a.proxy.SetDelay(0)
			c.sum.fault("latency of 10-300ms on every chunk for 0.5-3s", 1)
		}
		time.Sleep(uniform(c.rng, 200*time.Millisecond, 2*time.Second))
	}
	submitted, failed := stop()
	c.sum.note("%d runs submitted during the flaps (%d submissions failed)", submitted, failed)

	for range trials(1, 2) {
		c.waitAllTerminal(2 * time.Minute)
		since := time.Now()
		frozen := a.proxy.FreezeExisting()
		r := c.mustSubmit(api.RunSpec{Command: []string{"echo", "after the freeze"}})
		c.waitFor("a new session after the silent freeze", 3*time.Minute, func() bool { return a.wire.sessionsSince(since) > 0 })
		c.sum.fault("open connections frozen silently (no FIN, no reset)", 1)
		c.sum.note("freeze of %d connections: a new session %.1fs later (the agent's keep-alive timeout is 30s)", frozen, time.Since(since).Seconds())
		c.waitFor("the run launched on the frozen session to end", 3*time.Minute, func() bool {
			got, err := c.client.GetRun(context.Background(), r.ID)
			return err == nil && api.Terminal(got.Status)
		})
	}
	c.finish()
}

// submitLoop submits a run every lo-hi until the returned stop is called;
// stop reports how many submissions succeeded and failed (a control plane
// that is down refuses them; that is not a test failure).
func (c *cluster) submitLoop(lo, hi time.Duration) (stop func() (ok, failed int)) {
	var wg sync.WaitGroup
	done := make(chan struct{})
	var okN, failedN int
	var mu sync.Mutex
	// The loop has its own random source: c.rng is not safe for concurrent use.
	r := rng(c.t)
	r.Uint64()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(uniform(r, lo, hi)):
			}
			cmd := workloads[r.IntN(len(workloads))]
			_, err := c.submit(api.RunSpec{Command: cmd})
			mu.Lock()
			if err != nil {
				failedN++
			} else {
				okN++
			}
			mu.Unlock()
		}
	}()
	return func() (int, int) {
		close(done)
		wg.Wait()
		return okN, failedN
	}
}

// TestControlPlaneRestart kills the control plane with SIGKILL at random
// moments while runs are submitted, placed, launched and reported, and
// starts it again on the same data directory and port.
//
// What it proves: the store is the control plane's only state. No
// acknowledged event is forgotten (every ID the wire saw acknowledged is in
// the durable event table), an event replayed to the next life after its
// acknowledgement was lost is a duplicate rather than applied again, the
// pending operations are redelivered to the reconnecting agent, and every
// run ends as the daemon says.
func TestControlPlaneRestart(t *testing.T) {
	c := newCluster(t, clusterOptions{})
	c.addAgent("n")
	stop := c.submitLoop(150*time.Millisecond, 500*time.Millisecond)
	restarts := trials(4, 15)
	for range restarts {
		time.Sleep(uniform(c.rng, 300*time.Millisecond, 2500*time.Millisecond))
		c.killServer()
		time.Sleep(uniform(c.rng, 0, time.Second))
		c.startServer()
	}
	time.Sleep(time.Second)
	submitted, failed := stop()
	c.sum.fault("control plane kill -9, restarted on the same data dir and port", restarts)
	c.sum.note("%d runs submitted during the restarts (%d submissions failed while it was down)", submitted, failed)
	c.finish()
}

// TestFencedAgentIsRefused enrolls a node again, with a new invitation and a
// new agent process, while the old agent process still runs and holds work.
//
// What it proves (docs/design.md, promise 3): the new enrollment raises the fencing token;
// the old agent is refused with failure.ErrFenced and stops by itself; no
// call made with the superseded session is accepted, neither the old
// agent's own nor reports the test forges with its credential (a heartbeat,
// an observation claiming a run exited 99, renewal, a session, logs); and
// the new agent adopts the old one's containers (same names) instead of
// starting second ones.
func TestFencedAgentIsRefused(t *testing.T) {
	c := newCluster(t, clusterOptions{})
	old := c.addAgent("n")
	var runs []api.Run
	for range 3 {
		runs = append(runs, c.mustSubmit(api.RunSpec{Command: []string{"sleep", "3"}}))
	}
	runs = append(runs, c.mustSubmit(api.RunSpec{Command: []string{"exit", "3"}}))
	c.waitFor("a run running on the old agent", 60*time.Second, func() bool {
		r, err := c.client.GetRun(context.Background(), runs[0].ID)
		return err == nil && r.Status == api.RunRunning
	})
	before, err := c.scrape(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}

	fresh := c.newAgent(old.node, "n-again")
	since := time.Now()
	fresh.start()
	fresh.waitSession(since)
	c.sum.fault("node enrolled again while its old agent ran", 1)
	var fencedAt time.Time
	for _, ex := range fresh.wire.exchangesWithToken("") {
		if ex.path == nodeproto.PathEnroll && ex.status == http.StatusOK {
			fencedAt = ex.respAt
		}
	}
	if fencedAt.IsZero() {
		t.Fatal("the new agent's enrollment was not seen on the wire")
	}
	code := old.proc.wait(60 * time.Second)
	if code <= 0 {
		t.Fatalf("the superseded agent did not stop with an error (exit %d):\n%s", code, tail(old.log, 20))
	}
	// The agent says it was fenced, and the control plane's reason with it.
	if data, err := readFile(old.log); err != nil || !strings.Contains(data, "fenced by the control plane") || !strings.Contains(data, "enrolled again") {
		t.Errorf("the superseded agent's log does not say it was fenced by a new enrollment (%v):\n%s", err, tail(old.log, 20))
	}
	c.sum.note("the old agent stopped by itself (exit %d) %.1fs after the new enrollment", code, time.Since(fencedAt).Seconds())
	old.fenced = true

	st := old.openState()
	oldToken, _, _ := st.Session()
	st.Close()
	c.sum.staleChecked = true
	// Forge reports with the superseded credential.
	exit99 := 99
	forged := []struct {
		what, path string
		body       any
	}{
		{"heartbeat", nodeproto.PathEvents, nodeproto.EventBatch{Events: []nodeproto.Event{}}},
		{"observation of run " + runs[0].ID + " exiting 99", nodeproto.PathEvents, nodeproto.EventBatch{Events: []nodeproto.Event{{
			ID: "forged-0000000000000001", Kind: nodeproto.EventWorkload, At: time.Now().UTC(),
			Workload: &nodeproto.WorkloadObservation{WorkloadKey: nodeproto.WorkloadKey{RunID: runs[0].ID, Attempt: 1},
				Phase: nodeproto.PhaseExited, ExitCode: &exit99, StartedAt: ptr(time.Now().UTC()), FinishedAt: ptr(time.Now().UTC())}}}}},
		{"renewal", nodeproto.PathRenew, struct{}{}},
		{"session", nodeproto.PathSession, struct{}{}},
		{"logs", nodeproto.PathLogs, nodeproto.LogChunk{WorkloadKey: nodeproto.WorkloadKey{RunID: runs[0].ID, Attempt: 1}, Data: []byte("forged\n")}},
	}
	for _, f := range forged {
		status, code := c.nodeCall(old.node, oldToken, f.path, f.body)
		c.sum.fault("  forged call with the superseded credential: "+f.what, 1)
		if status/100 == 2 {
			c.sum.stale = append(c.sum.stale, fmt.Sprintf("forged %s answered %d", f.what, status))
		} else if status == http.StatusConflict && code == "fenced" {
			c.sum.staleRefused++
		} else {
			t.Errorf("forged %s: answered %d %q, want 409 fenced", f.what, status, code)
		}
	}
	// The old agent's own calls after the fence.
	oldRefused := 0
	for _, ex := range old.wire.exchangesWithToken(oldToken) {
		if ex.at.Before(fencedAt) || ex.status == 0 {
			continue
		}
		switch {
		case ex.status/100 == 2:
			c.sum.stale = append(c.sum.stale, fmt.Sprintf("the old agent's %s sent %s after the fence was answered %d", ex.path, ex.at.Format(time.RFC3339Nano), ex.status))
		case ex.status == http.StatusConflict:
			oldRefused++
		}
	}
	c.sum.staleRefused += oldRefused
	c.sum.note("the old agent made %d calls after the fence, all refused", oldRefused)
	after, err := c.scrape(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	refused := int(after[`mercator_node_calls_refused_total{reason="fenced"}`] - before[`mercator_node_calls_refused_total{reason="fenced"}`])
	if refused < c.sum.staleRefused {
		t.Errorf("mercator_node_calls_refused_total{reason=\"fenced\"} grew by %d, but %d fenced refusals were seen on the wire", refused, c.sum.staleRefused)
	}
	c.sum.note("mercator_node_calls_refused_total{reason=\"fenced\"} grew by %d", refused)
	c.finish()
}

func ptr[T any](v T) *T { return &v }

// nodeCall makes one node-protocol call and returns the status and the
// error code of the answer.
func (c *cluster) nodeCall(nodeID, token, path string, body any) (int, string) {
	c.t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url+path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set(nodeproto.HeaderNodeID, nodeID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s: %v", path, err)
	}
	defer resp.Body.Close()
	var e api.Error
	json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error.Code
}

// TestReplaceAfterUnreachable partitions the node running an attempt past
// the lease plus the run's replace_after_seconds, then lets it return. It is
// written against the documented behaviour (api.RunSpec.ReplaceAfterSeconds,
// lifecycle.Replace and lifecycle.Strays): the control plane replaces the
// attempt on another node, and when the partitioned node comes back with
// the old attempt still running, it is stopped, so at most one attempt
// keeps running and the run ends with its replacement's exit.
func TestReplaceAfterUnreachable(t *testing.T) {
	const lease = 3 * time.Second
	c := newCluster(t, clusterOptions{lease: lease})
	agents := map[string]*agent{}
	for _, s := range []string{"a", "b"} {
		a := c.addAgent(s)
		agents[a.node] = a
	}
	for range trials(1, 3) {
		r := c.mustSubmit(api.RunSpec{Command: []string{"sleep", "20"}, ReplaceAfterSeconds: 2})
		var run api.Run
		c.waitFor("the first attempt running", 60*time.Second, func() bool {
			var err error
			run, err = c.client.GetRun(context.Background(), r.ID)
			return err == nil && run.Status == api.RunRunning
		})
		victim := agents[run.Attempts[0].NodeID]
		cutAt := time.Now()
		victim.proxy.Cut()
		c.waitFor("a second attempt running elsewhere", 90*time.Second, func() bool {
			var err error
			run, err = c.client.GetRun(context.Background(), r.ID)
			return err == nil && len(run.Attempts) == 2 && run.Attempts[1].Status == api.AttemptRunning
		})
		replacedAfter := time.Since(cutAt)
		if run.Attempts[1].NodeID == victim.node {
			t.Errorf("run %s was replaced onto the unreachable node %s", r.ID, victim.node)
		}
		if !run.Attempts[0].Replaced {
			t.Errorf("run %s attempt 1 is not marked replaced: %+v", r.ID, run.Attempts[0])
		}
		victim.proxy.Restore()
		restoredAt := time.Now()
		c.sum.fault(fmt.Sprintf("node cut past lease %v + replace-after 2s, then restored", lease), 1)
		c.sum.note("run %s: replaced %.1fs after its node was cut", r.ID, replacedAfter.Seconds())
		c.waitFor("the replaced attempt's container to stop", 90*time.Second, func() bool {
			ct, ok := c.containerOf(r.ID, 1)
			return ok && ct.status != "running"
		})
		ct, _ := c.containerOf(r.ID, 1)
		c.sum.note("run %s: the replaced attempt stopped %.1fs after its node returned (ran %.1fs of 20s)", r.ID,
			ct.finished.Sub(restoredAt).Seconds(), ct.finished.Sub(ct.started).Seconds())
		// From here on at most one attempt may run.
		for range 10 {
			n := 0
			for _, ct := range c.containers(c.nodes()) {
				if ct.run == r.ID && ct.status == "running" {
					n++
				}
			}
			if n > 1 {
				t.Errorf("run %s has %d attempts running after the stray was stopped", r.ID, n)
			}
			time.Sleep(100 * time.Millisecond)
		}
		done := c.waitRun(r.ID, 2*time.Minute)
		if done.Status != api.RunSucceeded || len(done.Attempts) != 2 {
			t.Errorf("run %s ended %s with %d attempts, want succeeded by its replacement", r.ID, done.Status, len(done.Attempts))
		}
	}
	c.finish()
}

// TestSilentIdleConnections silences the agent's idle keep-alive
// connections, as a NAT gateway does when it forgets an idle mapping
// without telling either end, and then drops its session stream. The agent
// reconnects, and its HTTP client reuses one of the silenced connections for
// the new session.
//
// What it proves: the agent notices a dead connection by its own timeouts
// not only on an open session stream (the keep-alive watchdog) but also
// while opening one, so it gets a working session back, and the launch
// pending meanwhile is delivered and runs.
func TestSilentIdleConnections(t *testing.T) {
	c := newCluster(t, clusterOptions{})
	a := c.addAgent("n")
	// A trial counts only when it found an idle connection to silence: one
	// without is tried again, and too few counted trials fail the test, so
	// the case can never pass without having been exercised.
	want := trials(1, 3)
	maxAttempts := 3 * want
	done := 0
	for attempt := 1; done < want; attempt++ {
		if attempt > maxAttempts {
			t.Fatalf("only %d of %d trials found an idle keep-alive connection to silence in %d attempts: the case was not exercised", done, want, maxAttempts)
		}
		// Traffic that leaves idle connections in the agent's pool.
		var burst []api.Run
		for range 3 {
			burst = append(burst, c.mustSubmit(api.RunSpec{Command: []string{"lines", "3"}}))
		}
		for _, r := range burst {
			c.waitRun(r.ID, 2*time.Minute)
		}
		// The agent's pool keeps a connection once its response has been
		// read: wait for one to be idle rather than guess how long it takes.
		var sessions, idle []uint64
		if !c.poll(10*time.Second, func() bool {
			sessions, idle = a.wire.connsByUse()
			return len(idle) > 0
		}) {
			c.sum.note("attempt %d: no idle connection to silence; tried again", attempt)
			continue
		}
		trial := done
		done++
		for _, id := range idle {
			a.proxy.FreezeConn(id)
		}
		since := time.Now()
		for _, id := range sessions {
			a.proxy.CloseConn(id)
		}
		r := c.mustSubmit(api.RunSpec{Command: []string{"echo", "after the silence"}})
		c.waitFor("a working session after the idle connections went silent (an agent stuck here is opening its session on a "+
			"dead keep-alive connection with nothing bounding the wait for the response headers)", 90*time.Second, func() bool {
			return a.wire.sessionsSince(since) > 0
		})
		c.sum.fault("idle keep-alive connections silenced, then the session dropped", 1)
		c.sum.note("trial %d: %d idle connections silenced; a working session %.1fs after the drop", trial, len(idle), time.Since(since).Seconds())
		c.waitRun(r.ID, 2*time.Minute)
	}
	c.finish()
}
