package lifecycle

// Gang runs (issue 18, docs/gpus.md "Gang runs"): a run with Nodes above 1
// is tried as attempt sets. Each set is one attempt per member, placed
// together (PlaceGang), numbered like any attempt (so each member has its
// own workload key and launch operation) and tagged with the set's number
// and the member's rank. The set, not the attempt, is what the run's
// status follows:
//
//   - placed, preparing, running: running once every member runs (or has
//     already exited 0), preparing while any prepares or runs, placed
//     before that;
//   - succeeded once every member exited 0;
//   - when any member ends otherwise (fails, is preempted, is cancelled, or
//     its node is lost past replace-after: ReplaceMember) the set is
//     broken: the set's other members become strays (Strays), which the
//     control plane stops, and once they have stopped the run is queued
//     again as a whole (or fails, its retries spent). A distributed job
//     cannot go on without one of its ranks, and a new rank cannot join
//     the old ones' rendezvous.
//
// The retry budget is spent once per set (SpentSets), with the exemptions
// single runs have: a set broken by preemption, or by a bad GPU, is free.

import (
	"fmt"
	"time"

	"github.com/mercator/mercator/api"
)

// Gang reports whether r is a gang run.
func Gang(r *api.Run) bool { return r.Nodes > 1 }

// Member is where one member of a gang is placed: its node and the GPUs it
// holds there, in rank order.
type Member struct {
	NodeID string
	GPUs   []string
}

// PlaceGang records a new attempt set of queued gang run r, one attempt per
// member, rank i on members[i], and returns the attempts in rank order.
func PlaceGang(r *api.Run, members []Member, now time.Time) []api.Attempt {
	set := 1
	if cur := Current(r); cur != nil {
		set = cur.Set + 1
	}
	out := make([]api.Attempt, len(members))
	for i, m := range members {
		out[i] = api.Attempt{Number: len(r.Attempts) + 1, NodeID: m.NodeID, GPUs: m.GPUs, Status: api.AttemptPlaced, PlacedAt: now, Set: set, Rank: i}
		r.Attempts = append(r.Attempts, out[i])
	}
	r.Status, r.Reason, r.UpdatedAt = api.RunPlaced, "", now
	return out
}

// Members returns the run's current attempts: for a gang, every member of
// its latest set in rank order; otherwise the current attempt alone (none
// before the first placement).
func Members(r *api.Run) []*api.Attempt {
	cur := Current(r)
	if cur == nil {
		return nil
	}
	if !Gang(r) {
		return []*api.Attempt{cur}
	}
	var out []*api.Attempt
	for i := range r.Attempts {
		if a := &r.Attempts[i]; a.Set == cur.Set {
			out = append(out, a)
		}
	}
	return out
}

// MemberOn returns the current attempt on nodeID (for a gang, its current
// set's member there), or nil.
func MemberOn(r *api.Run, nodeID string) *api.Attempt {
	for _, a := range Members(r) {
		if a.NodeID == nodeID {
			return a
		}
	}
	return nil
}

// settleGang moves gang run r after its attempt a changed, judging a's set
// as the package comment says. An attempt of an older set, or of a set
// already judged (the run is queued or ended), changes nothing.
//
// A broken set is judged only once its other members have stopped (or
// were replaced on a lost node): until then the run keeps its status, with
// a reason saying it is stopping them, so the GPUs they hold are still
// counted as held and the next set is never placed on top of them.
func settleGang(r *api.Run, a *api.Attempt, now time.Time) {
	members := Members(r)
	if len(members) == 0 || members[0].Set != a.Set || api.Terminal(r.Status) || r.Status == api.RunQueued {
		return
	}
	if cause := brokenBy(members); cause != nil {
		for _, m := range members {
			if Active(*m) && !m.Replaced {
				r.Reason = "stopping the other members: " + describeMember(cause) + " " + endedHow(cause)
				return
			}
		}
		breakSet(r, cause, now)
		return
	}
	succeeded, running, preparing := 0, 0, 0
	for _, m := range members {
		switch m.Status {
		case api.AttemptSucceeded:
			succeeded++
		case api.AttemptRunning:
			running++
		case api.AttemptPreparing:
			preparing++
		}
	}
	switch {
	case succeeded == len(members):
		finish(r, api.RunSucceeded, "", a.ExitCode, now)
	case succeeded+running == len(members):
		r.Status = api.RunRunning
	case running+preparing > 0:
		r.Status = api.RunPreparing
	}
}

// brokenBy is the member whose end broke the set (replaced, or ended
// other than by succeeding), or nil while the set holds. When several
// ended, a replaced member is the cause before one that ended on its own,
// and that before one stopped because another broke the set (stop reason
// StopGang): the stops are consequences, not causes.
func brokenBy(members []*api.Attempt) *api.Attempt {
	var cause *api.Attempt
	weight := func(m *api.Attempt) int {
		switch {
		case m.Replaced:
			return 2
		case m.StopReason != StopGang:
			return 1
		}
		return 0
	}
	for _, m := range members {
		if !(m.Replaced || m.Status == api.AttemptFailed || m.Status == api.AttemptCancelled || m.Status == api.AttemptPreempted) {
			continue
		}
		if cause == nil || weight(m) > weight(cause) {
			cause = m
		}
	}
	return cause
}

// endedHow says how a set's broken member ended, for reasons.
func endedHow(m *api.Attempt) string {
	switch {
	case m.Replaced:
		return "was replaced: its node is unreachable"
	case m.Error != "":
		return m.Status + ": " + m.Error
	}
	return m.Status
}

// StopGang is the stop reason of a gang member stopped because another
// member ended (lifecycle.Strays).
const StopGang = "gang"

func describeMember(m *api.Attempt) string {
	return fmt.Sprintf("attempt set %d: rank %d (attempt %d on node %s)", m.Set, m.Rank, m.Number, m.NodeID)
}

// breakSet ends the current set of gang run r because member m ended
// without success: the run is queued again for a new set, or ends.
func breakSet(r *api.Run, m *api.Attempt, now time.Time) {
	what := describeMember(m)
	switch {
	case r.Cancel:
		finish(r, api.RunCancelled, "cancelled by request", m.ExitCode, now)
	case m.Replaced:
		// As for a single run, a lost node's attempt is replaced whatever
		// the budget says: nothing was observed to fail.
		r.Status = api.RunQueued
		r.Reason = what + " replaced: its node is unreachable; the gang is placed again"
	case m.Status == api.AttemptPreempted:
		r.Status = api.RunQueued
		r.Reason = fmt.Sprintf("%s %s; the gang is queued again (no retry spent)", what, m.PreemptedBy)
	default:
		sets, spent := SpentSets(r)
		if spent <= r.Retries && m.StopReason != "timeout" {
			r.Status = api.RunQueued
			r.Reason = fmt.Sprintf("%s failed (%s); retrying the gang (%d of %d retries used)", what, m.Error, spent, r.Retries)
			if spent < sets {
				r.Reason += fmt.Sprintf("; %d sets ended by a bad GPU or preempted did not count", sets-spent)
			}
			return
		}
		finish(r, api.RunFailed, what+" "+m.Error, m.ExitCode, now)
	}
}

// SpentSets is how many attempt sets gang run r has had, and how many of
// them count against its retries: all but those broken by a preempted
// member, or by a bad GPU (up to maxExcusedGPUFailures of them), as Spent
// counts a single run's attempts.
func SpentSets(r *api.Run) (sets, spent int) {
	excused, last := 0, 0
	type why struct{ preempted, gpu bool }
	byset := map[int]*why{}
	for _, a := range r.Attempts {
		w := byset[a.Set]
		if w == nil {
			w = &why{}
			byset[a.Set] = w
		}
		w.preempted = w.preempted || a.Status == api.AttemptPreempted
		w.gpu = w.gpu || (a.Failure != nil && a.Failure.Kind == api.AttemptFailureGPU)
		last = max(last, a.Set)
	}
	for set := 1; set <= last; set++ {
		w := byset[set]
		if w == nil {
			continue
		}
		sets++
		switch {
		case w.preempted:
		case w.gpu && excused < maxExcusedGPUFailures:
			excused++
		default:
			spent++
		}
	}
	return sets, spent
}

// ReplaceMember gives up on member a of gang run r because its node has
// been unreachable since the given moment: the member is marked replaced,
// the set is broken (the run queued again, the other members strays) and
// true is returned; false when there was nothing to replace (the member is
// no longer active or current, the run ended, is queued or is being
// cancelled).
func ReplaceMember(r *api.Run, a *api.Attempt, unreachableSince, now time.Time) bool {
	if a == nil || !Active(*a) || a.Replaced || api.Terminal(r.Status) || r.Status == api.RunQueued || r.Cancel || MemberOn(r, a.NodeID) != a {
		return false
	}
	a.Replaced = true
	settleGang(r, a, now)
	r.Reason += " (node " + a.NodeID + " unreachable since " + unreachableSince.UTC().Format(time.RFC3339) + ")"
	r.UpdatedAt = now
	return true
}

// gangStray reports whether gang member a must not run: its set is not
// the current one, or is broken, or the run is not waiting on it (queued
// again, ended).
func gangStray(r *api.Run, a *api.Attempt) bool {
	cur := Current(r)
	return a.Set != cur.Set || a.Replaced || r.Status == api.RunQueued || api.Terminal(r.Status) || brokenBy(Members(r)) != nil
}
