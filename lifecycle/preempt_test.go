package lifecycle

import (
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

// TestPreemptedAttemptRequeuesWithoutSpendingARetry: a preempted attempt
// that exits on its SIGTERM (exit 0, stop reason "preempted") ends
// preempted, not succeeded; the run is queued again saying who and why;
// a later failure still has the whole retry budget; a second preemption of
// the same attempt, or of one already stopping, is refused.
func TestPreemptedAttemptRequeuesWithoutSpendingARetry(t *testing.T) {
	r := newRun(1)
	Place(r, "n1", nil, t0)
	Observe(r, "n1", obs(1, nodeproto.PhaseRunning, nil), t0)
	why := "preempted by r-b (priority 100) to reclaim project nlp's quota"
	a := Preempt(r, 1, why, "reclaim:nlp", t0)
	if a == nil || !a.StopRequested || a.PreemptedFor != "reclaim:nlp" || r.Status != api.RunRunning {
		t.Fatalf("preempt: %+v, run %s", a, r.Status)
	}
	if Preempt(r, 1, why, "reclaim:nlp", t0) != nil {
		t.Error("an attempt already stopping was preempted again")
	}
	exited := obs(1, nodeproto.PhaseExited, ptr(0))
	exited.StopReason = "preempted"
	Observe(r, "n1", exited, t0)
	if r.Attempts[0].Status != api.AttemptPreempted || r.Status != api.RunQueued || !strings.Contains(r.Reason, why) || !strings.Contains(r.Reason, "no retry spent") {
		t.Fatalf("after the exit: attempt %s, run %s %q", r.Attempts[0].Status, r.Status, r.Reason)
	}
	Place(r, "n2", nil, t0)
	Observe(r, "n2", obs(2, nodeproto.PhaseExited, ptr(3)), t0)
	if r.Status != api.RunQueued || !strings.Contains(r.Reason, "1 of 1 retries used") {
		t.Fatalf("a failure after a preemption: %s %q, want a retry left", r.Status, r.Reason)
	}
	Place(r, "n2", nil, t0)
	Observe(r, "n2", obs(3, nodeproto.PhaseExited, ptr(3)), t0)
	if r.Status != api.RunFailed || Spent(&api.Run{Attempts: r.Attempts}) != 2 {
		t.Fatalf("the budget spent: %s, spent %d", r.Status, Spent(r))
	}
}
