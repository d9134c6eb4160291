package fault

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
)

// TestGangLostNode kills (kill -9) the agent process of one member's node
// while a gang of 2 runs; the member's container goes on, its node is
// unreachable. It is written against the documented behaviour
// (docs/gpus.md, Gang runs: "State and retry"): past the lease and the
// run's --replace-after the set is broken, the lost member marked replaced
// and the other stopped with reason gang, and the gang waits whole, with no
// new attempt, while one node is up; a third node joins and the gang is
// placed again as set 2, whole, although its retry budget is 0 (a lost
// node spends none). The killed agent then returns and the member it left
// running is stopped, set 2 running on; the run is then cancelled. finish checks the invariants: one container per
// attempt at most (nothing launched twice, within a set or across), the
// control plane's account agreeing with the daemon's, every event
// delivered once.
func TestGangLostNode(t *testing.T) {
	const lease = 2 * time.Second
	c := newCluster(t, clusterOptions{lease: lease})
	agents := map[string]*agent{}
	for _, s := range []string{"a", "b"} {
		a := c.addAgent(s)
		agents[a.node] = a
	}
	r := c.mustSubmit(api.RunSpec{Nodes: 2, ReplaceAfterSeconds: 1, Retries: 0, Command: []string{"sleep", "300"}})
	ctx := context.Background()
	var run api.Run
	get := func() bool {
		var err error
		run, err = c.client.GetRun(ctx, r.ID)
		return err == nil
	}
	c.waitFor("both members of set 1 running", 60*time.Second, func() bool { return get() && setRunning(run, 1) })
	set1 := attemptSet(run, 1)
	victim, kept := agents[set1[1].NodeID], set1[0]

	victim.kill()
	killedAt := time.Now()
	c.sum.fault(fmt.Sprintf("agent of a gang member's node killed past lease %v + replace-after 1s", lease), 1)
	c.waitFor("set 1 broken and the gang waiting whole", 60*time.Second, func() bool {
		if !get() || run.Status != api.RunQueued {
			return false
		}
		s := attemptSet(run, 1)
		return s[1].Replaced && s[0].FinishedAt != nil && s[0].StopReason == "gang" &&
			strings.Contains(run.Reason, "gang of 2: need 2 nodes") // the scheduler's reason, once it has looked
	})
	broken := time.Since(killedAt)
	if len(run.Attempts) != 2 {
		t.Fatalf("with one node up: %d attempts, want set 1's two only: %+v", len(run.Attempts), run.Attempts)
	}

	third := c.addAgent("c")
	joined := time.Now()
	c.waitFor("set 2 running", 60*time.Second, func() bool { return get() && setRunning(run, 2) })
	placed := time.Since(joined)
	set2 := attemptSet(run, 2)
	nodes := []string{set2[0].NodeID, set2[1].NodeID}
	if !slices.Contains(nodes, kept.NodeID) || !slices.Contains(nodes, third.node) {
		t.Fatalf("set 2 on %v, want %s (kept) and %s (joined)", nodes, kept.NodeID, third.node)
	}

	victim.start()
	returned := time.Now()
	c.waitFor("the lost member's container stopped", 60*time.Second, func() bool {
		ct, ok := c.containerOf(r.ID, set1[1].Number)
		return ok && ct.status != "running"
	})
	c.sum.note("run %s: set 1 broken %.1fs after the agent was killed; set 2 running %.1fs after a third node joined; the lost member stopped %.1fs after its agent returned",
		r.ID, broken.Seconds(), placed.Seconds(), time.Since(returned).Seconds())
	if !get() || !setRunning(run, 2) || len(run.Attempts) != 4 {
		t.Fatalf("once the lost agent returned: %s, %d attempts; want set 2 still running, 4 attempts", run.Status, len(run.Attempts))
	}
	if _, err := c.client.CancelRun(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	if done := c.waitRun(r.ID, 2*time.Minute); done.Status != api.RunCancelled {
		t.Errorf("run %s ended %s (%s), want cancelled", r.ID, done.Status, done.Reason)
	}
	c.finish()
}

// attemptSet is the run's attempts of one set, by rank.
func attemptSet(r api.Run, set int) []api.Attempt {
	var out []api.Attempt
	for _, a := range r.Attempts {
		if a.Set == set {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b api.Attempt) int { return a.Rank - b.Rank })
	return out
}

// setRunning reports whether set of r has both members running.
func setRunning(r api.Run, set int) bool {
	s := attemptSet(r, set)
	return r.Status == api.RunRunning && len(s) == 2 && s[0].Status == api.AttemptRunning && s[1].Status == api.AttemptRunning
}
