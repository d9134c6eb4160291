package controlplane

import (
	"net/url"
	"strconv"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/placement"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/store"
)

// replaceLostRun replaces the current attempt of run, or the member of a
// gang's current set, whose node has been lost (lostSince: since when,
// nil while not) for longer than the run's replace-after, withdraws its
// launch if the node never received it and, for a gang, stops the other
// members (lifecycle.ReplaceMember); it reports whether it replaced one.
func (s *Server) replaceLostRun(tx store.Tx, run *store.Run, lostSince func(nodeID string) (*time.Time, error), now time.Time) (bool, error) {
	after, ok := lifecycle.ReplaceAfter(&run.Run)
	if !ok {
		return false, nil
	}
	for _, a := range lifecycle.Members(&run.Run) {
		since, err := lostSince(a.NodeID)
		if err != nil || since == nil || now.Before(since.Add(after)) {
			if err != nil {
				return false, err
			}
			continue
		}
		if lifecycle.Gang(&run.Run) {
			ok = lifecycle.ReplaceMember(&run.Run, a, *since, now)
		} else {
			ok = lifecycle.Replace(&run.Run, *since, now) != nil
		}
		if !ok {
			continue
		}
		if err := placement.WithdrawLaunch(tx, a.NodeID, run.ID, a.Number, now); err != nil {
			return false, err
		}
		s.log.Warn("replacing attempt on unreachable node", "run", run.ID, "attempt", a.Number, "node", a.NodeID, "unreachable_since", *since)
		if lifecycle.Gang(&run.Run) {
			_, err = s.stopStrays(tx, &run.Run, a.NodeID) // the other members
		}
		return true, err
	}
	return false, nil
}

// logAttempt is the attempt whose log a request for run's logs asks for:
// ?attempt=N; for a gang, the member of ?rank=K (0 unless given) in its
// latest set; otherwise the latest attempt. 0 is "not placed yet".
func logAttempt(run api.Run, q url.Values) (int, error) {
	if v := q.Get("attempt"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > len(run.Attempts) {
			return 0, failure.Invalid("attempt", "run %s has attempts 1 to %d", run.ID, len(run.Attempts))
		}
		return n, nil
	}
	rank := 0
	if v := q.Get("rank"); v != "" {
		if !lifecycle.Gang(&run) {
			return 0, failure.Invalid("rank", "run %s is not a gang (it has no ranks); ask for an attempt instead", run.ID)
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n >= run.Nodes {
			return 0, failure.Invalid("rank", "run %s is a gang of %d: its ranks are 0 to %d, not %q", run.ID, run.Nodes, run.Nodes-1, v)
		}
		rank = n
	}
	if !lifecycle.Gang(&run) {
		return len(run.Attempts), nil
	}
	for _, a := range lifecycle.Members(&run) {
		if a.Rank == rank {
			return a.Number, nil
		}
	}
	return 0, nil
}
