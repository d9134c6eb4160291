package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
)

// TestPreemptionReclaimsBorrowedCapacity (issue 17) with real containers:
// project team-a, with no quota, fills the node's CPU by borrowing; team-b
// submits a run within its quota; one of team-a's runs gets SIGTERM (the
// workload prints what it received, and exits within its grace), its
// attempt ends preempted saying who and why, team-b's run starts and
// succeeds, and the preempted run is queued again, without spending a
// retry, and later succeeds.
func TestPreemptionReclaimsBorrowedCapacity(t *testing.T) {
	c := startCluster(t)
	node := c.startAgent("teams")
	facts := nodeFacts(t, c, node)
	free := facts.CPUs
	if facts.Functions != nil {
		free -= float64(facts.Functions.MilliCPUs) / 1000
	}
	per := free * 0.45 // two runs fit, three do not
	for _, p := range []api.Project{{Name: "team-a"}, {Name: "team-b", Quota: api.Quota{CPU: per}}} {
		if _, err := c.client.CreateProject(c.ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	var borrowed []api.Run
	for range 2 {
		borrowed = append(borrowed, c.submit(api.RunSpec{Project: "team-a", CPU: per, GraceSeconds: 20, Command: []string{"sleep", "15"}}))
	}
	c.waitFor("team-a's runs running on borrowed CPU", func() bool {
		for _, r := range borrowed {
			if got, _ := c.client.GetRun(c.ctx, r.ID); got.Status != api.RunRunning {
				return false
			}
		}
		return true
	})
	b := c.submit(api.RunSpec{Project: "team-b", CPU: per, Command: []string{"echo", "team-b"}})
	var victim api.Run
	c.waitFor("a team-a attempt preempted", func() bool {
		for _, r := range borrowed {
			got, _ := c.client.GetRun(c.ctx, r.ID)
			if len(got.Attempts) > 0 && got.Attempts[0].Status == api.AttemptPreempted {
				victim = got
				return true
			}
		}
		return false
	})
	want := fmt.Sprintf("preempted by %s (priority 0) to reclaim project team-b's quota", b.ID)
	if a := victim.Attempts[0]; a.PreemptedBy != want || a.PreemptedFor != "reclaim:team-b" {
		t.Errorf("victim's attempt: by %q for %q\nwant %q", a.PreemptedBy, a.PreemptedFor, want)
	}
	if log := c.attemptLog(victim.ID, 1); !strings.Contains(log, "received terminated") {
		t.Errorf("the preempted container's output %q does not show it saw SIGTERM", log)
	}
	if done := c.wait(b.ID); done.Status != api.RunSucceeded {
		t.Fatalf("team-b's run: %s %q", done.Status, done.Reason)
	}
	done := c.wait(victim.ID)
	if done.Status != api.RunSucceeded || len(done.Attempts) != 2 || done.Attempts[0].Status != api.AttemptPreempted {
		t.Fatalf("the preempted run: %s %q, attempts %+v", done.Status, done.Reason, done.Attempts)
	}
	for _, r := range borrowed {
		if got := c.wait(r.ID); got.Status != api.RunSucceeded {
			t.Errorf("team-a's run %s: %s %q", r.ID, got.Status, got.Reason)
		}
	}
}

// attemptLog is one attempt's output as the control plane holds it.
func (c *cluster) attemptLog(runID string, attempt int) string {
	c.t.Helper()
	req, err := http.NewRequestWithContext(c.ctx, http.MethodGet, fmt.Sprintf("%s/v1/runs/%s/logs?attempt=%d", c.url, runID, attempt), nil)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}
