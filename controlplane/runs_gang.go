package controlplane

import (
	"time"

	"github.com/mercator/mercator/controlplane/internal/placement"
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
