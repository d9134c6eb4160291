package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	dockerclient "github.com/docker/docker/client"

	"github.com/mercator/mercator/api"
)

// TestGangLostNode: a gang of 2 runs on two nodes; one node's agent
// process stops (its container goes on, as after a crash of the agent or
// of the machine's link), so the node is unreachable. Past the lease and
// --replace-after the set is broken: the other member is stopped (reason
// gang) and the gang waits whole, saying it needs two nodes. A third node
// joins and the gang is placed again as set 2, whole, with a retry budget
// of 0, which a lost node does not spend. When the lost agent returns, the
// member it left running is stopped: nothing ran twice within a set, and
// only set 2's members run.
func TestGangLostNode(t *testing.T) {
	c := startClusterWithLease(t, 2*time.Second)
	a, b := c.startAgent("a"), c.startAgent("b")
	spec := api.RunSpec{Nodes: 2, ReplaceAfterSeconds: 1, Retries: 0,
		Command: []string{"env-sleep", "300", "MERCATOR_RANK", "MERCATOR_WORLD_SIZE", "MERCATOR_MASTER_ADDR"}}
	run := c.submit(spec)
	var r api.Run
	defer func() {
		if t.Failed() {
			t.Logf("run %s when the test failed: %s %q, attempts %+v", run.ID, r.Status, r.Reason, r.Attempts)
		}
	}()
	c.waitFor("both members of set 1 running", func() bool {
		var err error
		r, err = c.client.GetRun(c.ctx, run.ID)
		return err == nil && runningSet(r, 1, 2)
	})
	first := gangSet(r, 1)
	lost, kept := first[1], first[0]
	if nodes := lost.NodeID + " " + kept.NodeID; nodes != a+" "+b && nodes != b+" "+a {
		t.Fatalf("members on %s, want one on each of %s and %s", nodes, a, b)
	}

	c.stopAgent(lost.NodeID)
	lostAt := time.Now()
	c.waitFor("set 1 broken: the kept member stopped for the gang, the gang waiting for 2 nodes", func() bool {
		var err error
		r, err = c.client.GetRun(c.ctx, run.ID)
		if err != nil {
			return false
		}
		set := gangSet(r, 1)
		return r.Status == api.RunQueued && set[0].FinishedAt != nil && set[0].StopReason == "gang" && set[1].Replaced &&
			strings.Contains(r.Reason, "gang of 2: need 2 nodes with room for a member; 1 has")
	})
	broken := time.Since(lostAt)
	set1 := gangSet(r, 1)
	t.Logf("%s after rank 1's agent stopped: set 1 = rank 0 %s (stopped: %s), rank 1 %s (replaced %v); run %s: %s",
		broken.Round(time.Millisecond), set1[0].Status, set1[0].StopReason, set1[1].Status, set1[1].Replaced, r.Status, r.Reason)
	if len(r.Attempts) != 2 {
		t.Fatalf("%d attempts while one node is up, want set 1's two only", len(r.Attempts))
	}

	cNode := c.startAgent("c")
	joined := time.Now()
	c.waitFor("set 2 running on the kept node and the new one", func() bool {
		var err error
		r, err = c.client.GetRun(c.ctx, run.ID)
		return err == nil && runningSet(r, 2, 2)
	})
	placed := time.Since(joined)
	second := gangSet(r, 2)
	if nodes := second[0].NodeID + " " + second[1].NodeID; nodes != kept.NodeID+" "+cNode && nodes != cNode+" "+kept.NodeID {
		t.Fatalf("set 2 on %s, want %s and %s", nodes, kept.NodeID, cNode)
	}
	if len(r.Attempts) != 4 {
		t.Fatalf("%d attempts, want 4 (two sets of two): %+v", len(r.Attempts), r.Attempts)
	}

	// The lost agent returns: the member it left running is stopped, and
	// only set 2's members run.
	c.restartAgent(lost.NodeID)
	c.waitFor("the lost node's member stopped and reported", func() bool {
		var err error
		r, err = c.client.GetRun(c.ctx, run.ID)
		return err == nil && gangSet(r, 1)[1].FinishedAt != nil && runningContainers(t, run.ID) == 2
	})
	if !runningSet(r, 2, 2) {
		t.Fatalf("set 2 after the lost agent returned: %s, %+v", r.Status, gangSet(r, 2))
	}
	for attempt, n := range launchesByAttempt(t, run.ID) {
		if n != 1 {
			t.Fatalf("attempt %s has %d containers, want 1: launched twice", attempt, n)
		}
	}
	t.Logf("gang of 2, a node lost: set 1 broken %s after its agent stopped (lease 2 s, replace-after 1 s); set 2 running %s after a third node joined",
		broken.Round(time.Millisecond), placed.Round(time.Millisecond))

	if _, err := c.client.CancelRun(c.ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	if done := c.wait(run.ID); done.Status != api.RunCancelled {
		t.Fatalf("cancelled gang: %s (%s)", done.Status, done.Reason)
	}
}

// launchesByAttempt counts the daemon's containers of a run (running or
// not) by their attempt label.
func launchesByAttempt(t *testing.T, runID string) map[string]int {
	t.Helper()
	dc, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	list, err := dc.ContainerList(context.Background(), container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", "mercator.run="+runID))})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, ctr := range list {
		out[fmt.Sprint(ctr.Labels["mercator.attempt"])]++
	}
	if len(out) != 4 {
		t.Fatalf("containers for attempts %v, want one for each of the 4 attempts", out)
	}
	return out
}
