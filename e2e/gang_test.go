package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"

	"github.com/mercator/mercator/api"
)

// gangVars are the variables each gang member prints (the test image's
// env-sleep), then it sleeps until stopped.
var gangVars = []string{"MERCATOR_RANK", "MERCATOR_WORLD_SIZE", "MERCATOR_MASTER_ADDR", "MERCATOR_MASTER_PORT",
	"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "NVIDIA_VISIBLE_DEVICES"}

// gangSet is the run's attempts of one set, by rank.
func gangSet(r api.Run, set int) []api.Attempt {
	var out []api.Attempt
	for _, a := range r.Attempts {
		if a.Set == set {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b api.Attempt) int { return a.Rank - b.Rank })
	return out
}

// runningSet reports whether set of r has all n members running.
func runningSet(r api.Run, set, n int) bool {
	members := gangSet(r, set)
	if r.Status != api.RunRunning || len(members) != n {
		return false
	}
	for _, a := range members {
		if a.Status != api.AttemptRunning || a.ContainerID == "" {
			return false
		}
	}
	return true
}

// TestGangRun stands in two 8×H100 machines (two agents on the one Docker
// daemon, the stand-in NVIDIA hook) and checks a gang of 2 × 8 GPUs end to
// end: with one node it waits with the scheduler's reason and nothing
// starts; with two, both members start at once with consistent rank
// variables (as each container's own output shows them) on disjoint
// machines' GPUs; `run get` lists them and `run logs --rank` reads each;
// killing one member's container stops the other and the gang is retried
// whole, both members starting again as a new attempt set.
func TestGangRun(t *testing.T) {
	requireGPUHook(t)
	c := startCluster(t)
	nodeA := c.startSwitchableAgent(t, "ganga", newSwitchableMachine(t, gpuMachine, ""))

	spec := gpuRun(8, append([]string{"env-sleep", "300"}, gangVars...)...)
	spec.Nodes, spec.Retries = 2, 1
	submitted := time.Now()
	run := c.submit(spec)

	var r api.Run
	defer func() {
		if t.Failed() {
			t.Logf("run %s when the test failed: %s %q, attempts %+v", run.ID, r.Status, r.Reason, r.Attempts)
		}
	}()
	c.waitFor("the gang waiting with the scheduler's reason", func() bool {
		var err error
		r, err = c.client.GetRun(c.ctx, run.ID)
		return err == nil && r.Status == api.RunQueued && strings.Contains(r.Reason, "gang of 2: need 2 nodes with 8 free H100 GPUs; 1 has")
	})
	t.Logf("with one node free (%s) the gang waits: %s", nodeA, r.Reason)
	if len(r.Attempts) != 0 {
		t.Fatalf("a gang that cannot be placed whole was partly placed: %+v", r.Attempts)
	}
	if got := c.mercator("run", "get", run.ID); !strings.Contains(got, "1 has") {
		t.Fatalf("run get does not show why the gang waits:\n%s", got)
	}

	nodeB := c.startSwitchableAgent(t, "gangb", newSwitchableMachine(t, gpuMachine, "0"))
	joined := time.Now()
	c.waitFor("both members of set 1 running", func() bool {
		var err error
		r, err = c.client.GetRun(c.ctx, run.ID)
		return err == nil && runningSet(r, 1, 2)
	})
	started := time.Since(joined)
	members := gangSet(r, 1)
	if nodes := []string{members[0].NodeID, members[1].NodeID}; !slices.Contains(nodes, nodeA) || !slices.Contains(nodes, nodeB) {
		t.Fatalf("members on %v, want one on each of %s and %s", nodes, nodeA, nodeB)
	}
	if len(members[0].GPUs) != 8 || len(members[1].GPUs) != 8 || !disjoint(members[0].GPUs, members[1].GPUs) {
		t.Fatalf("members' GPUs %v and %v: want 8 each, disjoint", members[0].GPUs, members[1].GPUs)
	}
	master := c.hostnameOf(members[0].NodeID)
	for _, m := range members {
		c.checkRankVars(t, run.ID, m, master)
	}
	got := c.mercator("run", "get", run.ID)
	t.Logf("mercator run get %s:\n%s", run.ID, got)
	if !strings.Contains(got, "Members (gang of 2, attempt set 1)") {
		t.Fatalf("run get does not list the members:\n%s", got)
	}
	if _, errOut, code := c.mercatorExit("", "run", "logs", run.ID, "--rank", "2"); code == 0 || !strings.Contains(errOut, "ranks are 0 to 1") {
		t.Fatalf("run logs --rank 2 of a gang of 2: exit %d, stderr %q; want an error naming the ranks", code, errOut)
	}

	// One member dies (its container killed behind Mercator's back): the
	// other is stopped and the gang is placed again, whole.
	killed := members[1]
	dc, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	killedAt := time.Now()
	if err := dc.ContainerKill(context.Background(), killed.ContainerID, "KILL"); err != nil {
		t.Fatalf("docker kill rank 1's container: %v", err)
	}
	c.waitFor("set 1 ended and set 2 running", func() bool {
		r, err = c.client.GetRun(c.ctx, run.ID)
		if err != nil || !runningSet(r, 2, 2) {
			return false
		}
		for _, a := range gangSet(r, 1) {
			if a.FinishedAt == nil {
				return false
			}
		}
		return true
	})
	retried := time.Since(killedAt)
	old := gangSet(r, 1)
	t.Logf("set 1 after the kill: rank 0 %s (%s, stopped: %s), rank 1 %s (%s)", old[0].Status, old[0].Error, old[0].StopReason, old[1].Status, old[1].Error)
	if old[1].Status != api.AttemptFailed || old[0].StopReason != "gang" {
		t.Fatalf("set 1 = %+v, want rank 1 failed and rank 0 stopped for the gang", old)
	}
	next := gangSet(r, 2)
	if next[0].Number <= old[1].Number || !disjoint(next[0].GPUs, next[1].GPUs) || next[0].NodeID == next[1].NodeID {
		t.Fatalf("set 2 = %+v", next)
	}
	for _, m := range next {
		c.checkRankVars(t, run.ID, m, c.hostnameOf(next[0].NodeID))
	}
	t.Logf("gang of 2×8 GPUs: members running %s after the second node joined (submitted %s before it); set 2 running %s after rank 1 was killed",
		started.Round(time.Millisecond), joined.Sub(submitted).Round(time.Millisecond), retried.Round(time.Millisecond))

	if _, err := c.client.CancelRun(c.ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	done := c.wait(run.ID)
	if done.Status != api.RunCancelled {
		t.Fatalf("cancelled gang: %s (%s)", done.Status, done.Reason)
	}
	c.waitFor("every member stopped", func() bool {
		r, err := c.client.GetRun(c.ctx, run.ID)
		if err != nil {
			return false
		}
		for _, a := range r.Attempts {
			if a.FinishedAt == nil {
				return false
			}
		}
		return true
	})
}

// hostnameOf is the host name a node reported in its facts.
func (c *cluster) hostnameOf(nodeID string) string {
	c.t.Helper()
	n, err := c.client.GetNode(c.ctx, nodeID)
	if err != nil || n.Facts == nil {
		c.t.Fatalf("node %s: %v", nodeID, err)
	}
	host, _ := (*n.Facts)["hostname"].(string)
	return host
}

// checkRankVars reads member m's output through `run logs --rank` and
// checks the variables it printed: its rank, the gang's size, rank 0's
// node's host name and the default port, eight local GPUs, and exactly
// its own GPUs visible.
func (c *cluster) checkRankVars(t *testing.T, runID string, m api.Attempt, master string) {
	t.Helper()
	var out string
	c.waitFor(fmt.Sprintf("rank %d's output", m.Rank), func() bool {
		out, _, _ = c.mercatorExit("", "run", "logs", runID, "--rank", fmt.Sprint(m.Rank))
		return strings.Contains(out, "sleeping")
	})
	want := map[string]string{
		"MERCATOR_RANK": fmt.Sprint(m.Rank), "RANK": fmt.Sprint(m.Rank), "MERCATOR_WORLD_SIZE": "2", "WORLD_SIZE": "2",
		"MERCATOR_MASTER_ADDR": master, "MASTER_ADDR": master, "MERCATOR_MASTER_PORT": "29500", "MASTER_PORT": "29500",
		"LOCAL_WORLD_SIZE": "8", "NVIDIA_VISIBLE_DEVICES": strings.Join(m.GPUs, ","),
	}
	for name, value := range want {
		if !strings.Contains(out, "\n"+name+"="+value+"\n") && !strings.HasPrefix(out, name+"="+value+"\n") {
			t.Errorf("set %d rank %d (attempt %d on %s) printed:\n%s\nwant %s=%s", m.Set, m.Rank, m.Number, m.NodeID, out, name, value)
		}
	}
}
