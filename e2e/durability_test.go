package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
)

// runningContainers counts the daemon's running containers of a run, over
// all attempts.
func runningContainers(t testing.TB, runID string) int {
	out, err := exec.Command("docker", "ps", "-q", "--filter", "label=mercator.run="+runID).Output()
	if err != nil {
		t.Fatal(err)
	}
	return len(strings.Fields(string(out)))
}

// TestUnreachableNodeIsReplacedAndStrayStopped: a node goes silent with its
// attempt running; past lease + replace-after the run gets a new attempt on
// another node; when the silent node comes back, its attempt is stopped, so
// at most one attempt keeps running.
func TestUnreachableNodeIsReplacedAndStrayStopped(t *testing.T) {
	c := startClusterWithLease(t, 2*time.Second)
	a := c.startAgent("a")
	run := c.submit(api.RunSpec{Command: []string{"sleep", "300"}, ReplaceAfterSeconds: 1})
	c.waitFor("running on a", func() bool {
		r, _ := c.client.GetRun(c.ctx, run.ID)
		return r.Status == api.RunRunning
	})
	b := c.startAgent("b")
	c.stopAgent(a)

	c.waitFor("attempt 1 shown as unknown", func() bool {
		r, _ := c.client.GetRun(c.ctx, run.ID)
		return len(r.Attempts) >= 1 && r.Attempts[0].Status == api.AttemptUnknown
	})
	c.waitFor("replacement running on b", func() bool {
		r, _ := c.client.GetRun(c.ctx, run.ID)
		return len(r.Attempts) == 2 && r.Attempts[1].NodeID == b && r.Status == api.RunRunning
	})
	if r, _ := c.client.GetRun(c.ctx, run.ID); !r.Attempts[0].Replaced {
		t.Fatalf("attempt 1 not marked replaced: %+v", r.Attempts[0])
	}
	// Both containers run now: a's is alive but unreachable.
	if n := runningContainers(t, run.ID); n != 2 {
		t.Fatalf("%d running containers while a is unreachable, want 2 (a's survives the agent)", n)
	}
	c.restartAgent(a)
	c.waitFor("the stray attempt stopped", func() bool { return runningContainers(t, run.ID) == 1 })
	// The daemon shows the stop before the node's report of it has been
	// delivered and applied; wait for the report, then judge it.
	var r api.Run
	c.waitFor("the stray attempt's end reported", func() bool {
		r, _ = c.client.GetRun(c.ctx, run.ID)
		return len(r.Attempts) == 2 && r.Attempts[0].FinishedAt != nil
	})
	first := r.Attempts[0]
	if first.Status == api.AttemptRunning || first.Status == api.AttemptUnknown || first.FinishedAt == nil || first.StopReason != "replaced" {
		t.Fatalf("attempt 1 after a returned: %+v", first)
	}
	if r.Status != api.RunRunning || r.Attempts[1].Status != api.AttemptRunning {
		t.Fatalf("run %s, attempt 2 %s: the replacement must be unaffected", r.Status, r.Attempts[1].Status)
	}
	if _, err := c.client.CancelRun(c.ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	c.wait(run.ID)
}

// TestExitDuringPartitionIsReported: a container that exits while its agent
// is down is reported when the agent returns, with the daemon's moments,
// and the run ends as the daemon says — never inferred.
func TestExitDuringPartitionIsReported(t *testing.T) {
	c := startClusterWithLease(t, 2*time.Second)
	a := c.startAgent("a")
	run := c.submit(api.RunSpec{Command: []string{"sleep", "3"}, ReplaceAfterSeconds: -1})
	c.waitFor("running", func() bool {
		r, _ := c.client.GetRun(c.ctx, run.ID)
		return r.Status == api.RunRunning
	})
	c.stopAgent(a)
	c.waitFor("the container exited on the daemon", func() bool { return runningContainers(t, run.ID) == 0 })
	// Judge once the control plane has noticed the silence (the lease ran
	// out and the attempt is shown unknown): it has then had every chance to
	// infer an end, and must not have.
	c.waitFor("the attempt shown unknown", func() bool {
		r, err := c.client.GetRun(c.ctx, run.ID)
		if err == nil && api.Terminal(r.Status) {
			t.Fatalf("run ended (%s) while its node was silent: inferred, not reported", r.Status)
		}
		return err == nil && len(r.Attempts) == 1 && r.Attempts[0].Status == api.AttemptUnknown
	})
	if n, err := c.client.GetNode(c.ctx, a); err != nil || n.Status != api.NodeUnreachable {
		t.Fatalf("node %s while its agent is down: %v %v, want %s", a, n.Status, err, api.NodeUnreachable)
	}
	if r, err := c.client.GetRun(c.ctx, run.ID); err != nil || api.Terminal(r.Status) {
		t.Fatalf("run ended (%s, %v) while its node was silent: inferred, not reported", r.Status, err)
	}
	c.restartAgent(a)
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	defer cancel()
	r, err := c.client.WaitRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	at := r.Attempts[0]
	if r.Status != api.RunSucceeded || at.StartedAt == nil || at.FinishedAt == nil || at.FinishedAt.Sub(*at.StartedAt) < 2*time.Second {
		t.Fatalf("run %s attempt %+v", r.Status, at)
	}
	if len(r.Attempts) != 1 {
		t.Fatalf("%d attempts; replace-after was never", len(r.Attempts))
	}
}
