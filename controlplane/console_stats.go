package controlplane

import (
	"context"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane/internal/history"
	"github.com/mercator/mercator/controlplane/internal/nodepage"
	"github.com/mercator/mercator/controlplane/internal/schedcopy"
)

// consoleStats is what the console reads beside the API (console.Stats):
// this replica's series (package history) and the function containers
// the nodes last reported, from the scheduler's copy of the nodes.
type consoleStats struct{ s *Server }

func (c consoleStats) Fleet() ([]history.FleetPoint, time.Time) {
	return c.s.history.FleetPoints(), c.s.history.Since()
}

func (c consoleStats) Latency(fnID string) []history.LatencyPoint {
	return c.s.history.LatencyPoints(fnID)
}

// Hot is each of fnIDs' containers on each ready node, as the nodes'
// last facts state them: the copy of the nodes' records the scheduler and
// the metrics read (nodeList), not a read of every record per page.
func (c consoleStats) Hot(ctx context.Context, fnIDs []string) (map[string][]client.FnContainers, error) {
	nodes, err := c.s.nodeList(ctx, c.s.nodeListAge())
	if err != nil {
		return nil, err
	}
	want := make(map[string]bool, len(fnIDs))
	for _, id := range fnIDs {
		want[id] = true
	}
	out := map[string][]client.FnContainers{}
	for _, n := range nodes {
		if n.Facts == nil || n.Facts.Functions == nil || c.s.nodeStatus(n) != api.NodeReady {
			continue
		}
		for _, ct := range n.Facts.Functions.Containers {
			if want[ct.FnID] {
				out[ct.FnID] = append(out[ct.FnID], client.FnContainers{NodeID: n.ID, Idle: ct.Idle, Busy: ct.Busy, Starting: ct.Starting, Prepared: ct.Prepared})
			}
		}
	}
	return out, nil
}

// historyLoop samples the console's series every history.Period: the
// fleet's GPUs counted from the replica's copies (sampleFleet), the
// queue's depth where this replica schedules, and each function's latency
// histogram as Prometheus keeps it (history.Tap).
func (s *Server) historyLoop(ctx context.Context) {
	t := time.NewTicker(history.Period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sampleHistory(ctx)
	}
}

// sampleHistory takes one sample of each series.
func (s *Server) sampleHistory(ctx context.Context) {
	now := s.now()
	if byFn, err := s.fnLatency.Read(); err == nil {
		s.history.Latency(now, byFn)
	}
	sum, err := s.sampleFleet(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("console history: the fleet could not be counted", "err", err)
		}
		return
	}
	p := history.FleetPoint{At: now, Busy: sum.GPUs["busy"], Idle: sum.GPUs["idle"], Sick: sum.GPUs["flagged"]}
	if s.leader() { // the queue's order is the scheduling replica's (runs_queue.go)
		p.Queued, p.QueueKnown = len(s.queue.Ordered("")), true
	}
	s.history.Fleet(p)
}

// sampleFleet counts the fleet's nodes and GPUs from the replica's copies
// rather than the store: the copy of the nodes' records (refreshed by
// version) and the copy of what active attempts hold, which every replica
// keeps up to date this way (refreshUsage: the runs other replicas'
// signals named, read again, and a whole rebuild every resyncEvery). Each
// sample read every node and every active run from the store, on every
// replica, a minute apart: at 50,000 active runs on PostgreSQL, 6 s of
// the database's time a sample, its costliest statement.
func (s *Server) sampleFleet(ctx context.Context) (api.FleetSummary, error) {
	nodes, err := s.nodeList(ctx, s.nodeListAge())
	if err != nil {
		return api.FleetSummary{}, err
	}
	if err := s.refreshUsage(ctx); err != nil {
		return api.FleetSummary{}, err
	}
	held := map[string][]string{}
	s.sched.EachNode(func(node string, u *schedcopy.NodeUse) {
		for g := range u.GPUs {
			held[node] = append(held[node], g)
		}
	})
	_, _, sum := nodepage.Page(nodes, nodepage.Options{Limit: 1}, s.nodeStatus, func(id string) []string { return held[id] })
	return sum, nil
}
