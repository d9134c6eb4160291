package fleetsim

import (
	"context"
	"fmt"
	"time"

	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/fleetsim/internal/capacity"
)

// Killing the leader (Config.KillLeader). A replica that leads the
// scheduling is killed mid-hold, while it places a backlog: its placement
// transactions die with its connections, and the next leader must take over
// without two replicas ever committing placements onto the same capacity
// (the store's scheduling epoch fences the old one: docs/guide.md). What the
// report says (KillReport): how soon another replica led and placed, how
// many placements each side made, and whether any node ended up holding
// more than its capacity in the runs placed on it (over-commit, which a
// second leader placing on a stale view would cause), read from the control
// plane's own records of every run.

// Metric series the leader kill follows on each replica.
const (
	leaderSeries      = "mercator_scheduler_leader"
	placementsSeries  = "mercator_placements_total"
	epochStartSeries  = "mercator_scheduler_epoch_start_timestamp_seconds"
	firstPlacedSeries = "mercator_scheduler_epoch_first_placement_timestamp_seconds"
)

// leaderWait bounds how long the replicas may take to elect a leader, and
// a survivor to lead and place after the kill.
const leaderWait = 2 * time.Minute

// waitLeader returns the index of the replica that leads, once one does.
func (s *sim) waitLeader(ctx context.Context) (int, error) {
	deadline := time.Now().Add(leaderWait)
	for time.Now().Before(deadline) {
		s.scrapeAll(ctx)
		for i, r := range s.replicas {
			if r.metric(leaderSeries) == 1 {
				return i, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("no replica led the scheduling within %v", leaderWait)
}

// metric is a series of the replica's last scrape.
func (r *replica) metric(series string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.metrics[series]
}

// takeover follows the survivors after the leader was killed, until one
// leads and has placed, or leaderWait passed.
type takeover struct {
	placedBefore float64 // the survivors' placements when the leader died
	leaderAt     time.Time
	placedAt     time.Time
}

// startTakeover notes the placements each side made up to the kill.
func (s *sim) startTakeover(ctx context.Context, h *holdState, victimPlacements float64) {
	s.scrapeAll(ctx)
	h.takeover = &takeover{placedBefore: s.sumOf(s.survivors, placementsSeries)}
	h.kill.Leader = true
	h.kill.PlacementsByKilled = int64(victimPlacements)
}

// followTakeover scrapes the survivors once and reports whether the
// takeover is over (a survivor led and placed, or the wait passed). The
// figures are the survivor's own timestamps of its epoch; when a scrape
// first showed each is kept beside them. A survivor that just took 5,000
// sessions over answers its scrapes seconds late, which once made the
// takeover look 20 s longer than it was.
func (s *sim) followTakeover(ctx context.Context, h *holdState) bool {
	t := h.takeover
	s.scrapeAll(ctx)
	now := time.Now()
	if t.leaderAt.IsZero() && s.sumOf(s.survivors, leaderSeries) >= 1 {
		t.leaderAt = now
		h.kill.NewLeaderSeenMS = ms(now.Sub(h.killAt))
		h.kill.NewLeaderMS = s.sinceKill(h, epochStartSeries)
	}
	if t.placedAt.IsZero() && s.sumOf(s.survivors, placementsSeries) > t.placedBefore {
		t.placedAt = now
		h.kill.FirstPlacementSeenMS = ms(now.Sub(h.killAt))
		h.kill.FirstPlacementMS = s.sinceKill(h, firstPlacedSeries)
	}
	return (!t.leaderAt.IsZero() && !t.placedAt.IsZero()) || now.Sub(h.killAt) > leaderWait
}

// sinceKill is how long after the kill the earliest survivor's timestamp
// series (Unix seconds) is, in milliseconds; 0 when none has one after it.
func (s *sim) sinceKill(h *holdState, series string) float64 {
	killed := float64(h.killAt.UnixNano()) / 1e9
	first := 0.0
	for _, r := range s.survivors {
		if v := r.metric(series); v > killed && (first == 0 || v < first) {
			first = v
		}
	}
	if first == 0 {
		return 0
	}
	return (first - killed) * 1000
}

// sumOf adds a series over some replicas' last scrapes.
func (s *sim) sumOf(rs []*replica, series string) float64 {
	total := 0.0
	for _, r := range rs {
		total += r.metric(series)
	}
	return total
}

// reportTakeover completes the kill's report at the end of the hold: the
// survivors' placements since the kill, and the nodes over capacity.
func (s *sim) reportTakeover(ctx context.Context, rep *Report, h *holdState) {
	if h.takeover == nil || rep.Kill == nil {
		return
	}
	rep.Kill.PlacementsAfter = int64(s.sumOf(s.survivors, placementsSeries) - h.takeover.placedBefore)
	over, checked, err := overCommitted(ctx, s.admin, s.cfg.NodeCPUs, s.cfg.NodeMemory)
	if err != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the over-commit check could not read the runs: %v", err))
		rep.Kill.OverCommitted = -1
		return
	}
	rep.Kill.OverCommitted, rep.Kill.RunsChecked = over, checked
}

// overCommitted reads every run through c and counts the nodes whose
// active attempts ask for more CPU or memory than the node has
// (capacity.Ledger); checked is how many runs were read.
func overCommitted(ctx context.Context, c *client.Client, cpus float64, memory int64) (over, checked int, err error) {
	var ledger capacity.Ledger
	before := ""
	for {
		page, err := c.ListRuns(ctx, client.ListRunsOptions{Limit: 1000, Before: before})
		if err != nil {
			return 0, checked, err
		}
		for _, r := range page.Runs {
			ledger.Add(r)
		}
		checked += len(page.Runs)
		if len(page.Runs) < 1000 {
			break
		}
		before = page.Runs[len(page.Runs)-1].ID
	}
	return ledger.Over(cpus, memory), checked, nil
}
