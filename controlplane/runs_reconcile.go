package controlplane

import (
	"context"
	"maps"
	"sort"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/factcheck"
	"github.com/mercator/mercator/controlplane/internal/gang"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/internal/placement"
	"github.com/mercator/mercator/controlplane/internal/plancommit"
	"github.com/mercator/mercator/controlplane/internal/schedcopy"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// reconcileLoop places pending runs whenever something may have changed (a
// submission, a finished attempt, new facts) and at least every
// ReconcileEvery, which is also what notices expired leases.
func (s *Server) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ReconcileEvery)
	defer t.Stop()
	led, ledTerm := false, uint64(0) // whether, and in which term, this replica started an epoch
	for {
		// Only the leader schedules; other replicas serve API calls and
		// sessions and check again on the next tick.
		leading := s.leader()
		if leading && (!led || s.term() != ledTerm) {
			leading = s.startEpoch(ctx)
			led, ledTerm = leading, s.term()
		}
		if !leading && led {
			s.endEpoch()
		}
		if !leading {
			led = false
		}
		if leading {
			s.metrics.Leader.Set(1)
		} else {
			s.metrics.Leader.Set(0)
		}
		if leading {
			start := time.Now()
			if err := s.reconcile(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("reconcile", "err", err)
			}
			// Wakes arrive with every submission and every report that
			// changes a run; spacing passes lets one pass take what a
			// burst of them brought.
			if rest := minPass - time.Since(start); rest > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(rest):
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.reconcileWake:
		}
	}
}

// startEpoch starts a scheduling epoch as this replica starts to lead
// (store.Lead: the placements of a replica that led before are committed,
// or will be refused, from here on) and drops what this replica copied
// while another led, which may have missed that one's placements. False
// when the store could not start one; the loop tries again next tick.
//
// With replicas it then wakes every session stream, on every replica
// (wakeSessions). The replica that led before may have committed
// placements whose signals never left it: one killed between a commit and
// its outbox's send, or whose last commit landed after it was cut off
// (Lead waited for it), after its nodes had already moved their sessions
// to other replicas and read their pending operations there. Those
// launches would wait for their streams' poll (sessionPoll keep-alives,
// 5 minutes); seen in a fleet simulation that killed the leader, 17 of
// 100,000 runs did. Once Lead has returned, what the replica before
// placed is in the store, so one look by every stream finds it.
func (s *Server) startEpoch(ctx context.Context) bool {
	epoch, err := s.store.Lead(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("start a scheduling epoch; will retry", "err", err)
		}
		return false
	}
	s.epoch.Store(epoch)
	s.epochPlaced.Store(false)
	s.metrics.EpochFirstPlaced.Set(0)
	s.metrics.EpochStarted.Set(unixSeconds(s.now()))
	s.sched.Invalidate()
	s.queued.Invalidate()
	s.sched.ForgetNodes()
	if s.coord != nil {
		s.wakeSessions()
	}
	s.log.Info("scheduling", "epoch", epoch)
	return true
}

// endEpoch clears the epoch's timestamps as this replica stops leading.
func (s *Server) endEpoch() {
	s.metrics.EpochStarted.Set(0)
	s.metrics.EpochFirstPlaced.Set(0)
}

// notePlaced records the epoch's first placement (EpochFirstPlaced) once n
// placements have committed.
func (s *Server) notePlaced(n int) {
	s.metrics.Placements.Add(float64(n))
	if n > 0 && s.epochPlaced.CompareAndSwap(false, true) {
		s.metrics.EpochFirstPlaced.Set(unixSeconds(s.now()))
	}
}

// unixSeconds is t as a timestamp gauge's value.
func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// issue stores a command for a node under the node's current fencing token.
// The caller notifies the node's session after its transaction commits.
// The node is read with LockNode: an enrollment (UpdateLocked) that
// replaces the token re-fences the node's pending operations, and must
// not commit between this read and this transaction's commit, or the
// command would be left under the old token, which the new agent refuses.
func (s *Server) issue(tx store.Tx, nodeID string, cmd nodeproto.Command) error {
	n, err := tx.LockNode(nodeID)
	if err != nil {
		return err
	}
	_, err = s.issueFenced(tx, nodeID, n.FencingToken, cmd)
	return err
}

// issueFenced is issue with the node's fencing token already read in tx; it
// returns the command as stored.
func (s *Server) issueFenced(tx store.Tx, nodeID string, fence uint64, cmd nodeproto.Command) (nodeproto.Command, error) {
	op := s.operation(nodeID, fence, cmd)
	return op.Command, tx.PutOperation(op)
}

// operation is cmd as a new operation for the node under fence.
func (s *Server) operation(nodeID string, fence uint64, cmd nodeproto.Command) store.Operation {
	cmd.OperationID = httpapi.NewID("op-")
	cmd.FencingToken = fence
	cmd.CreatedAt = s.now()
	return store.Operation{ID: cmd.OperationID, NodeID: nodeID, CreatedAt: cmd.CreatedAt, Command: cmd}
}

// sameNodes reports whether two node lists are the same slice.
func sameNodes(a, b []store.Node) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// minPass is the least time from the start of one reconcile pass to the
// start of the next.
const minPass = 20 * time.Millisecond

// placeChunk bounds the placements (or reasons) one transaction commits: a
// plan for a hundred thousand runs must not hold SQLite's single writer,
// which heartbeat-driven work and submissions wait on, for seconds, and
// the first nodes can start on their work while the rest commits. A
// hundred holds the writer for about 20 ms on the 2-core machine the fleet
// simulator ran on (500 held it for ~100 ms, a wait every submission and
// event batch behind it paid).
//
// With several replicas on PostgreSQL the chunk is smaller. It was first
// made so for serializable retries; placements now commit locked
// (store.UpdateLocked), and larger chunks were measured again (round 35,
// 100,000 runs through 10,000 simulated nodes, two replicas, a quiet
// 2-core machine): chunks of 200 placed 895-1,157/s against 835-882/s,
// but command delivery p50 rose from 83-106 ms to 160-302 ms, and with
// the leader killed mid-backlog they placed 588-778/s against 860-898/s,
// one of two runs with 948 missed leases (heartbeat gap 88 s) where three
// runs at 50 had none. Two chunks of 200 committing at once placed no
// more (1,106/s). So 50 it stays.
const placeChunk, placeChunkReplicas = 100, 50

func (s *Server) placeChunk() int {
	if s.coord != nil {
		return placeChunkReplicas
	}
	return placeChunk
}

// reconcile deals with lost nodes and passed drain deadlines, runs the
// scheduler once, and commits its plan: each placement becomes an attempt
// and a launch operation in the same transaction, and each waiting run gets
// its reason. A pass with nothing queued, no node lost and no drain due
// reads only the queue (and, at most once per liveness flush period, the
// nodes' records).
func (s *Server) reconcile(ctx context.Context) error {
	queued, err := s.queuedRuns(ctx)
	if err != nil {
		return err
	}
	placing := waitingIn(queued) > 0
	var lost map[string]time.Time
	var drained map[string]bool
	if s.judgeMayBeDue(placing) {
		nodes, err := s.nodeList(ctx, s.nodeListAge())
		if err != nil {
			return err
		}
		lost, drained = s.judgeNodes(nodes, placing)
	}
	refreshed := false
	if len(lost) > 0 || len(drained) > 0 {
		if err := s.refreshUsage(ctx); err != nil {
			return err
		}
		refreshed = true
		if err := s.replaceLost(ctx, lost); err != nil {
			return err
		}
		if err := s.enforceDrains(ctx, drained); err != nil {
			return err
		}
	}
	if queued, err = s.queuedRuns(ctx); err != nil { // again: lost nodes' runs went back to the queue
		return err
	}
	if waitingIn(queued) == 0 {
		s.metrics.Pending.Set(0)
		return nil
	}
	if !refreshed {
		if err := s.refreshUsage(ctx); err != nil {
			return err
		}
	}
	// The sums by node stand for the runs: a pass costs O(nodes).
	snap, pending := placement.Snapshot(s.schedView.view, s.schedView.index, s.sched.EachNodeSum, queued)
	plan, err := s.schedule(ctx, snap, queued, pending) // runs_teams.go
	if err != nil {
		return err
	}
	placed := 0
	for _, chunk := range gang.Chunks(plan.Placements, s.placeChunk()) { // a gang's members in one chunk
		n, tooOld, err := s.commitPlacements(ctx, chunk, pending)
		placed += n
		s.notePlaced(n) // as each chunk commits: a long pass's first placements show at once
		if err != nil {
			return err
		}
		maps.Copy(plan.Waiting, tooOld)
	}
	if err := s.commitReasons(ctx, plan.Waiting, pending); err != nil {
		return err
	}
	s.noteQueue(plan.Waiting, plan.Order, pending) // runs_queue.go
	s.metrics.Pending.Set(float64(len(plan.Waiting)))
	if placed > 0 {
		s.log.Info("placed runs", "count", placed, "waiting", len(plan.Waiting))
		s.runsChanged()
	}
	return nil
}

// waitingIn counts the queued runs not being cancelled.
func waitingIn(queued []store.Run) int {
	n := 0
	for _, r := range queued {
		if !r.Cancel {
			n++
		}
	}
	return n
}

// judgeNodes rebuilds the view of the nodes (schedView) and judges their
// statuses, returning the unreachable nodes whose work is lost (since
// when) and the draining ones past their deadline. It does so once per
// liveness flush period, or when the records changed and the pass will
// place (placing: a run waits), and otherwise returns nothing: a pass runs
// at every submission and enrollment, and judging is O(nodes). A fleet
// enrolling onto an empty queue rebuilt the view at every pass, for every
// node that joined: at 10,000 nodes on PostgreSQL, a fifth of the control
// plane's CPU while the fleet came up.
func (s *Server) judgeNodes(nodes []store.Node, placing bool) (lost map[string]time.Time, drained map[string]bool) {
	lost, drained = map[string]time.Time{}, map[string]bool{}
	v := &s.schedView
	if s.judgedLately() && (!placing || sameNodes(nodes, v.from)) {
		return lost, drained
	}
	now := s.now()
	mem := s.live.Snapshot()
	v.view, v.index = make([]scheduler.Node, 0, len(nodes)), make(map[string]int, len(nodes))
	for _, n := range nodes {
		seen := freshest(n, mem)
		status := s.statusSeen(n, seen, now)
		v.index[n.ID] = len(v.view)
		v.view = append(v.view, placement.Node(n, status, now))
		if since := placement.LostSince(n, status, seen, s.cfg.Lease); since != nil {
			lost[n.ID] = *since
		}
		if n.Draining && n.DrainDeadline != nil && !now.Before(*n.DrainDeadline) {
			drained[n.ID] = true
		}
	}
	v.from, v.at = nodes, time.Now()
	s.metrics.SetGPUStates(factcheck.CountStates(nodes))
	return lost, drained
}

// judgedLately reports whether the nodes were judged within the liveness
// flush period.
func (s *Server) judgedLately() bool {
	return time.Since(s.schedView.at) < s.live.FlushPeriod()
}

// judgeMayBeDue reports whether judgeNodes might judge at this pass, so
// that a pass which will not skips reading the nodes' copy: each read that
// follows this replica's own writes of node records builds a new list of
// every node (schedcopy.Copy.Nodes), and a fleet enrolling onto an empty
// queue wrote records at every pass. At 10,000 nodes on PostgreSQL those
// lists were 7% of the control plane's CPU while the fleet came up, and
// its largest allocator (a tenth of the bytes) over a 100,000-run hold.
func (s *Server) judgeMayBeDue(placing bool) bool {
	return placing || !s.judgedLately()
}

// commitPlacements commits placements in one transaction, returning how
// many it made (their launches reach the nodes' sessions as the
// transaction commits: see txrecord.Tx) and, by run ID, why a placement on a
// node whose agent is too old for its commands was not made. A run that
// changed since the snapshot is left for the next pass (plancommit.Apply).
func (s *Server) commitPlacements(ctx context.Context, placements []scheduler.Placement, pending map[string]store.Run) (int, map[string]string, error) {
	var placed int
	var tooOld map[string]string
	// Locked (store.UpdateLocked): each run is read by key, checked to be
	// as the plan saw it, and written back; nodes and artifacts are read by
	// key.
	nodeIDs := plancommit.NodeIDs(placements)
	err := s.updateLocked(ctx, func(tx store.Tx) error {
		// Refused, whole, once another replica has started to schedule:
		// this one's belief that it leads may have outlived the fact.
		if err := tx.CheckEpoch(s.epoch.Load()); err != nil {
			return err
		}
		var err error
		placed, tooOld, err = plancommit.Apply(tx, placements, nodeIDs, pending, s.now, s.operation)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	return placed, tooOld, nil
}

// commitReasons records why each waiting run waits, writing only the runs
// whose reason is due (plancommit.ReasonDue).
func (s *Server) commitReasons(ctx context.Context, waiting map[string]string, pending map[string]store.Run) error {
	var changed []string
	now := s.now()
	for id, why := range waiting {
		if r, ok := pending[id]; !ok || plancommit.ReasonDue(r, why, now) {
			changed = append(changed, id)
		}
	}
	sort.Strings(changed)
	for start := 0; start < len(changed); start += s.placeChunk() {
		chunk := changed[start:min(start+s.placeChunk(), len(changed))]
		// In batches (store.Tx.GetRuns, PutRuns): the first pass over a
		// backlog gives every waiting run its reason, and one read and one
		// write per run were two round trips each to PostgreSQL, seconds
		// for a long queue, during which nothing was placed.
		if err := s.update(ctx, func(tx store.Tx) error {
			runs, err := tx.GetRuns(chunk)
			if err != nil {
				return err
			}
			changed := runs[:0]
			for _, run := range runs {
				if run.Status != api.RunQueued || !plancommit.ReasonDue(run, waiting[run.ID], now) {
					continue
				}
				run.Reason, run.UpdatedAt = waiting[run.ID], now
				changed = append(changed, run)
			}
			return tx.PutRuns(changed)
		}); err != nil {
			return err
		}
	}
	return nil
}

// replaceLost replaces the current attempt of every run whose node has been
// unreachable (lost: since when) for longer than the run's replace-after
// (lifecycle.Replace), and withdraws the attempt's launch if the node never
// received it. The run goes back to the queue in the same transaction, so
// the scheduling pass that follows places it elsewhere. The runs considered
// are those whose current attempt the copy of active attempts puts on a
// lost node; each is read again, and its node judged again, in the
// transaction.
func (s *Server) replaceLost(ctx context.Context, lost map[string]time.Time) error {
	var candidates []string
	s.sched.EachActive(func(id string, u schedcopy.Usage) {
		// Any active attempt's node: a gang's members are on several.
		for _, a := range u.Attempts {
			if _, down := lost[a.Node]; down {
				candidates = append(candidates, id)
				return
			}
		}
	})
	if len(candidates) == 0 {
		return nil
	}
	sort.Strings(candidates)
	replaced := 0
	err := s.update(ctx, func(tx store.Tx) error {
		replaced = 0
		now := s.now()
		judged := map[string]*time.Time{} // node → lost since; nil: not lost
		lostSince := func(nodeID string) (*time.Time, error) {
			since, ok := judged[nodeID]
			if !ok {
				n, err := tx.GetNode(nodeID)
				if err != nil {
					return nil, err
				}
				since = placement.LostSince(n, s.nodeStatus(n), s.live.LastSeen(n), s.cfg.Lease)
				judged[nodeID] = since
			}
			return since, nil
		}
		for _, id := range candidates {
			run, err := tx.GetRun(id)
			if err != nil {
				return err
			}
			ok, err := s.replaceLostRun(tx, &run, lostSince, now) // runs_gang.go
			if err != nil || !ok {
				if err != nil {
					return err
				}
				continue
			}
			if err := tx.PutRun(run); err != nil {
				return err
			}
			replaced++
		}
		return nil
	})
	if replaced > 0 {
		s.runsChanged()
	}
	return err
}

// enforceDrains stops the remaining attempts on every draining node whose
// deadline has passed, once each (the stop reason is "drained", and a
// drained attempt fails its run like any stopped attempt, so the run's
// retry policy can place it elsewhere).
//
// drained names the nodes whose deadline the copy of the records shows
// passed; only those the copy of active attempts shows holding some are
// visited, and each is read again in the transaction.
func (s *Server) enforceDrains(ctx context.Context, drained map[string]bool) error {
	busy := map[string]bool{}
	s.sched.EachActive(func(_ string, u schedcopy.Usage) {
		for _, a := range u.Attempts {
			if drained[a.Node] {
				busy[a.Node] = true
			}
		}
	})
	if len(busy) == 0 {
		return nil
	}
	ids := make([]string, 0, len(busy))
	for id := range busy {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var touched []string
	err := s.update(ctx, func(tx store.Tx) error {
		touched = touched[:0]
		now := s.now()
		for _, id := range ids {
			n, err := tx.GetNode(id)
			if err != nil {
				return err
			}
			if !n.Draining || n.DrainDeadline == nil || now.Before(*n.DrainDeadline) {
				continue
			}
			runs, err := tx.ListRuns(store.ListRunsOptions{NodeID: n.ID, Statuses: []string{api.RunPlaced, api.RunPreparing, api.RunRunning}})
			if err != nil {
				return err
			}
			for _, run := range runs {
				a := lifecycle.MemberOn(&run.Run, n.ID) // a gang's member here, or the current attempt
				if a == nil || !lifecycle.Active(*a) || a.StopRequested {
					continue
				}
				if err := s.issue(tx, n.ID, nodeproto.Command{Kind: nodeproto.KindStopWorkload, StopWorkload: &nodeproto.StopWorkloadCommand{
					WorkloadKey: nodeproto.WorkloadKey{RunID: run.ID, Attempt: a.Number}, Reason: "drained", GracePeriod: 10 * time.Second}}); err != nil {
					return err
				}
				a.StopRequested = true
				if err := tx.PutRun(run); err != nil {
					return err
				}
				touched = append(touched, n.ID)
				s.log.Info("drain deadline passed; stopping attempt", "node", n.ID, "run", run.ID, "attempt", a.Number)
			}
		}
		return nil
	})
	for _, id := range touched {
		s.nodeChanged(id)
	}
	return err
}
