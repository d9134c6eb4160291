package lifecycle

import (
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

func newGang(retries int) *api.Run {
	r := newRun(retries)
	r.Nodes = 2
	return r
}

func placeTwo(r *api.Run) []api.Attempt {
	return PlaceGang(r, []Member{{NodeID: "n1", GPUs: []string{"g1"}}, {NodeID: "n2", GPUs: []string{"g2"}}}, t0)
}

func strayNumbers(r *api.Run) []int {
	var out []int
	for _, a := range Strays(r) {
		out = append(out, a.Number)
	}
	return out
}

// TestGangRunsWhenAllRunAndSucceedsWhenAllSucceed: the run follows its
// set, not its latest attempt.
func TestGangRunsWhenAllRunAndSucceedsWhenAllSucceed(t *testing.T) {
	r := newGang(0)
	as := placeTwo(r)
	if as[0].Set != 1 || as[1].Set != 1 || as[0].Rank != 0 || as[1].Rank != 1 || as[0].Number == as[1].Number {
		t.Fatalf("first set = %+v", as)
	}
	Observe(r, "n2", obs(2, nodeproto.PhaseRunning, nil), t0)
	if r.Status != api.RunPreparing {
		t.Fatalf("one member of two running: status %s, want preparing", r.Status)
	}
	Observe(r, "n1", obs(1, nodeproto.PhaseRunning, nil), t0)
	if r.Status != api.RunRunning {
		t.Fatalf("both running: status %s", r.Status)
	}
	Observe(r, "n1", obs(1, nodeproto.PhaseExited, ptr(0)), t0)
	if r.Status != api.RunRunning {
		t.Fatalf("rank 0 done, rank 1 running: status %s, want running", r.Status)
	}
	Observe(r, "n2", obs(2, nodeproto.PhaseExited, ptr(0)), t0)
	if r.Status != api.RunSucceeded || len(Strays(r)) != 0 {
		t.Fatalf("both succeeded: status %s, strays %v", r.Status, strayNumbers(r))
	}
}

// TestGangMemberFailureRetriesTheWholeSetOnce: one member failing makes
// the other a stray; the run says it is stopping it and keeps its status
// (its GPUs still held) until it has stopped, then queues the gang once,
// spending one retry; the next set gets new attempt numbers; a second
// failure past the budget fails the run.
func TestGangMemberFailureRetriesTheWholeSetOnce(t *testing.T) {
	r := newGang(1)
	placeTwo(r)
	Observe(r, "n1", obs(1, nodeproto.PhaseRunning, nil), t0)
	Observe(r, "n2", obs(2, nodeproto.PhaseRunning, nil), t0)
	Observe(r, "n2", obs(2, nodeproto.PhaseExited, ptr(137)), t0)
	if r.Status != api.RunRunning || !strings.Contains(r.Reason, "stopping the other members: attempt set 1: rank 1") {
		t.Fatalf("after a member failed: %s %q, want running, stopping the other", r.Status, r.Reason)
	}
	if got := strayNumbers(r); len(got) != 1 || got[0] != 1 {
		t.Fatalf("strays = %v, want rank 0's attempt 1", got)
	}
	stop := obs(1, nodeproto.PhaseExited, ptr(143))
	stop.StopReason = StopGang
	Observe(r, "n1", stop, t0)
	if r.Status != api.RunQueued || !strings.Contains(r.Reason, "rank 1") || !strings.Contains(r.Reason, "retrying the gang (1 of 1") {
		t.Fatalf("once the other stopped: %s %q, want queued, rank 1 the cause", r.Status, r.Reason)
	}
	if sets, spent := SpentSets(r); sets != 1 || spent != 1 {
		t.Fatalf("SpentSets = %d, %d; want 1, 1", sets, spent)
	}
	second := placeTwo(r)
	if second[0].Set != 2 || second[0].Number != 3 || second[1].Number != 4 {
		t.Fatalf("second set = %+v", second)
	}
	if Observe(r, "n1", obs(1, nodeproto.PhaseRunning, nil), t0) && r.Status != api.RunPlaced {
		t.Fatalf("an old set's report moved the run to %s", r.Status)
	}
	LaunchFailed(r, "n1", 3, "could not start: no such image", t0)
	if got := strayNumbers(r); len(got) != 1 || got[0] != 4 {
		t.Fatalf("strays after rank 0 could not start = %v, want attempt 4", got)
	}
	LaunchFailed(r, "n2", 4, "could not start: withdrawn", t0)
	if r.Status != api.RunFailed || !strings.Contains(r.Reason, "attempt set 2: rank 0") {
		t.Fatalf("second set failed with no retry left: %s %q", r.Status, r.Reason)
	}
}

// TestGangPreemptedOrBadGPUSpendsNothing: a set broken by preemption or
// by a bad GPU does not count against the retries.
func TestGangPreemptedOrBadGPUSpendsNothing(t *testing.T) {
	r := newGang(0)
	placeTwo(r)
	Observe(r, "n1", obs(1, nodeproto.PhaseRunning, nil), t0)
	if a := GPUFailed(r, "n2", []SickGPU{{UUID: "g2", Reason: "gpu_lost"}}, t0); a == nil || a.Number != 2 {
		t.Fatalf("GPUFailed on rank 1's node = %+v", a)
	}
	stop := obs(1, nodeproto.PhaseExited, ptr(143))
	stop.StopReason = StopGang
	Observe(r, "n1", stop, t0)
	if r.Status != api.RunQueued {
		t.Fatalf("a bad GPU with no retries: %s %q, want queued", r.Status, r.Reason)
	}
	placeTwo(r)
	Preempt(r, 3, "preempted by r-x", "priority:p", t0)
	Observe(r, "n1", obs(3, nodeproto.PhaseExited, ptr(143)), t0)
	LaunchFailed(r, "n2", 4, "could not start: withdrawn", t0)
	if r.Status != api.RunQueued || !strings.Contains(r.Reason, "no retry spent") {
		t.Fatalf("preempted member: %s %q", r.Status, r.Reason)
	}
	if sets, spent := SpentSets(r); sets != 2 || spent != 0 {
		t.Fatalf("SpentSets = %d, %d; want 2, 0", sets, spent)
	}
}

// TestGangCancelStopsEveryMember: cancelling returns one member to stop
// and makes the others strays; the run ends cancelled once all stopped.
func TestGangCancelStopsEveryMember(t *testing.T) {
	r := newGang(3)
	placeTwo(r)
	a := Cancel(r, t0)
	if a == nil {
		t.Fatal("Cancel returned nothing to stop")
	}
	a.StopRequested = true
	others := strayNumbers(r)
	if len(others) != 1 || others[0] == a.Number {
		t.Fatalf("strays while cancelling = %v (stopped %d)", others, a.Number)
	}
	for _, n := range []int{a.Number, others[0]} {
		stop := obs(n, nodeproto.PhaseExited, ptr(143))
		stop.StopReason = "cancelled"
		Observe(r, Find(r, n).NodeID, stop, t0)
	}
	if r.Status != api.RunCancelled {
		t.Fatalf("status %s, want cancelled", r.Status)
	}
}

// TestGangReplaceMember: a member whose node is lost breaks the set,
// whatever the budget: the other is stopped, then the gang is queued
// again; only a current member can be replaced.
func TestGangReplaceMember(t *testing.T) {
	r := newGang(0)
	placeTwo(r)
	if !ReplaceMember(r, &r.Attempts[1], t0, t0) {
		t.Fatal("ReplaceMember refused a current member")
	}
	if !strings.Contains(r.Reason, "was replaced") || r.Status != api.RunPlaced {
		t.Fatalf("%s %q", r.Status, r.Reason)
	}
	if got := strayNumbers(r); len(got) != 2 {
		t.Fatalf("strays = %v, want both members", got)
	}
	LaunchFailed(r, "n1", 1, "could not start: withdrawn", t0)
	if r.Status != api.RunQueued || !strings.Contains(r.Reason, "rank 1") {
		t.Fatalf("once rank 0 ended: %s %q, want queued for rank 1's node", r.Status, r.Reason)
	}
	if ReplaceMember(r, &r.Attempts[0], t0, t0) {
		t.Fatal("a member of a broken set was replaced")
	}
	if MemberOn(r, "n2") != &r.Attempts[1] || len(Members(r)) != 2 {
		t.Fatal("Members/MemberOn do not give the current set")
	}
}
