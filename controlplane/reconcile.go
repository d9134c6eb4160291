package controlplane

import (
	"context"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/node"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// reconcileLoop places pending runs whenever something may have changed (a
// submission, a finished attempt, new facts) and at least every
// ReconcileEvery, which is also what notices expired leases.
func (s *Server) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ReconcileEvery)
	defer t.Stop()
	for {
		// Only the leader schedules; other replicas serve API calls and
		// sessions and check again on the next tick.
		leading := s.leader()
		if leading {
			s.metrics.leader.Set(1)
		} else {
			s.metrics.leader.Set(0)
		}
		if leading {
			if err := s.reconcile(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("reconcile", "err", err)
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

// issue stores a command for a node under the node's current fencing token.
// The caller notifies the node's session after its transaction commits.
func (s *Server) issue(tx store.Tx, nodeID string, cmd node.Command) error {
	n, err := tx.GetNode(nodeID)
	if err != nil {
		return err
	}
	cmd.OperationID = newID("op-")
	cmd.FencingToken = n.FencingToken
	return tx.PutOperation(store.Operation{ID: cmd.OperationID, NodeID: nodeID, CreatedAt: s.now(), Command: cmd})
}

// snapshot builds the scheduler's view from the store.
func (s *Server) snapshot(tx store.Tx) (scheduler.Snapshot, map[string]store.Run, error) {
	var snap scheduler.Snapshot
	nodes, err := tx.ListNodes()
	if err != nil {
		return snap, nil, err
	}
	byID := map[string]*scheduler.Node{}
	for _, n := range nodes {
		sn := scheduler.Node{ID: n.ID, UsedGPUs: map[string]bool{}, Images: map[string]bool{}}
		switch s.nodeStatus(n) {
		case api.NodeReady:
			sn.Ready = true
			if n.Draining {
				sn.Ready, sn.NotReadyReason = false, "is draining"
			}
			sn.Cordoned = n.Cordoned
		case api.NodeInvited:
			sn.NotReadyReason = "has not enrolled yet"
		default:
			sn.NotReadyReason = "is unreachable"
		}
		if f := n.Facts; f != nil {
			sn.CPU, sn.MemoryBytes = f.CPUs, f.MemoryBytes
			for _, img := range f.Images {
				sn.Images[img] = true
			}
			for _, g := range f.Accelerators {
				sn.GPUs = append(sn.GPUs, scheduler.GPU{UUID: g.UUID, Model: g.Model, MemoryBytes: g.MemoryBytes})
			}
		}
		snap.Nodes = append(snap.Nodes, sn)
	}
	for i := range snap.Nodes {
		byID[snap.Nodes[i].ID] = &snap.Nodes[i]
	}
	active, err := tx.ListRuns(store.ListRunsOptions{Statuses: []string{api.RunPlaced, api.RunPreparing, api.RunRunning}})
	if err != nil {
		return snap, nil, err
	}
	for _, r := range active {
		// Every attempt that may still hold resources counts, replaced ones
		// included: a replaced attempt can be alive on its node.
		for _, a := range r.Attempts {
			n := byID[a.NodeID]
			if !lifecycle.Active(a) || n == nil {
				continue
			}
			n.UsedCPU += r.CPU
			n.UsedMemory += r.MemoryBytes
			for _, g := range a.GPUs {
				n.UsedGPUs[g] = true
			}
		}
	}
	queued, err := tx.ListRuns(store.ListRunsOptions{Statuses: []string{api.RunQueued}})
	if err != nil {
		return snap, nil, err
	}
	pending := map[string]store.Run{}
	for i := len(queued) - 1; i >= 0; i-- { // oldest first
		r := queued[i]
		if r.Cancel {
			continue
		}
		pending[r.ID] = r
		snap.Pending = append(snap.Pending, scheduler.Run{ID: r.ID, Image: r.PinnedImage, CPU: r.CPU, MemoryBytes: r.MemoryBytes,
			GPUs: r.GPUs, GPUModel: r.GPUModel, GPUMemory: r.GPUMemoryBytes})
	}
	return snap, pending, nil
}

// reconcile runs the scheduler once and commits its plan: each placement
// becomes an attempt and a launch operation in one transaction, and each
// waiting run gets its reason.
func (s *Server) reconcile(ctx context.Context) error {
	if err := s.replaceLost(ctx); err != nil {
		return err
	}
	if err := s.enforceDrains(ctx); err != nil {
		return err
	}
	var plan scheduler.Plan
	var pending map[string]store.Run
	if err := s.store.View(ctx, func(tx store.Tx) error {
		snap, p, err := s.snapshot(tx)
		if err != nil {
			return err
		}
		pending = p
		if len(snap.Pending) > 0 {
			plan = scheduler.Schedule(snap)
		}
		return nil
	}); err != nil {
		return err
	}
	if len(plan.Placements) == 0 && len(plan.Waiting) == 0 {
		return nil
	}
	touched := map[string]bool{}
	err := s.store.Update(ctx, func(tx store.Tx) error {
		clear(touched)
		now := s.now()
		for _, p := range plan.Placements {
			run, err := tx.GetRun(p.RunID)
			if err != nil {
				return err
			}
			if run.Status != api.RunQueued || run.Cancel || len(run.Attempts) != len(pending[p.RunID].Attempts) {
				continue // changed since the snapshot; the next pass sees it
			}
			a := lifecycle.Place(&run.Run, p.NodeID, p.GPUs, now)
			cmd := node.Command{Kind: node.KindLaunchWorkload, LaunchWorkload: &capability.LaunchWorkloadCommand{
				WorkloadKey: capability.WorkloadKey{RunID: run.ID, Attempt: a.Number},
				Image:       run.PinnedImage, Command: run.Command, Env: run.Env,
				CPU: run.CPU, MemoryBytes: run.MemoryBytes, GPUs: p.GPUs,
				Timeout: time.Duration(run.TimeoutSeconds) * time.Second,
			}}
			if err := s.issue(tx, p.NodeID, cmd); err != nil {
				return err
			}
			if err := tx.PutRun(run); err != nil {
				return err
			}
			touched[p.NodeID] = true
		}
		for id, why := range plan.Waiting {
			run, err := tx.GetRun(id)
			if err != nil {
				return err
			}
			if run.Status != api.RunQueued || run.Reason == why {
				continue
			}
			run.Reason, run.UpdatedAt = why, now
			if err := tx.PutRun(run); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for id := range touched {
		s.nodeChanged(id)
	}
	s.metrics.placements.Add(float64(len(plan.Placements)))
	s.metrics.pending.Set(float64(len(plan.Waiting)))
	if len(plan.Placements) > 0 {
		s.log.Info("placed runs", "count", len(plan.Placements), "waiting", len(plan.Waiting))
		s.runsChanged()
	}
	return nil
}

// replaceLost replaces the current attempt of every run whose node has been
// unreachable for longer than the run's replace-after (lifecycle.Replace),
// and withdraws the attempt's launch if the node never received it. The run
// goes back to the queue in the same transaction, so the scheduling pass
// that follows places it elsewhere.
func (s *Server) replaceLost(ctx context.Context) error {
	replaced := 0
	err := s.store.Update(ctx, func(tx store.Tx) error {
		replaced = 0
		nodes, err := tx.ListNodes()
		if err != nil {
			return err
		}
		since := map[string]time.Time{}
		for _, n := range nodes {
			if s.nodeStatus(n) == api.NodeUnreachable && n.LastSeenAt != nil {
				since[n.ID] = n.LastSeenAt.Add(s.cfg.Lease)
			}
		}
		if len(since) == 0 {
			return nil
		}
		runs, err := tx.ListRuns(store.ListRunsOptions{Statuses: []string{api.RunPlaced, api.RunPreparing, api.RunRunning}})
		if err != nil {
			return err
		}
		now := s.now()
		for _, run := range runs {
			a := lifecycle.Current(&run.Run)
			if a == nil {
				continue
			}
			lost, down := since[a.NodeID]
			after, ok := lifecycle.ReplaceAfter(&run.Run)
			if !down || !ok || now.Before(lost.Add(after)) {
				continue
			}
			if lifecycle.Replace(&run.Run, lost, now) == nil {
				continue
			}
			if err := s.withdrawLaunch(tx, a.NodeID, run.ID, a.Number, now); err != nil {
				return err
			}
			if err := tx.PutRun(run); err != nil {
				return err
			}
			replaced++
			s.log.Warn("replacing attempt on unreachable node", "run", run.ID, "attempt", a.Number, "node", a.NodeID, "unreachable_since", lost)
		}
		return nil
	})
	if replaced > 0 {
		s.runsChanged()
	}
	return err
}

// withdrawLaunch settles a still-pending launch of the attempt so it is not
// delivered when the node returns. A launch already delivered is not
// affected: the node reports the attempt and it is stopped as a stray.
func (s *Server) withdrawLaunch(tx store.Tx, nodeID, runID string, attempt int, now time.Time) error {
	ops, err := tx.PendingOperations(nodeID)
	if err != nil {
		return err
	}
	for _, op := range ops {
		l := op.Command.LaunchWorkload
		if l == nil || l.RunID != runID || l.Attempt != attempt {
			continue
		}
		op.Result = &node.Result{OperationID: op.ID, Kind: op.Command.Kind, Outcome: node.OutcomeRefused, At: now,
			Error: "withdrawn by the control plane: the attempt was replaced while its node was unreachable"}
		if err := tx.PutOperation(op); err != nil {
			return err
		}
	}
	return nil
}

// enforceDrains stops the remaining attempts on every draining node whose
// deadline has passed, once each (the stop reason is "drained", and a
// drained attempt fails its run like any stopped attempt, so the run's
// retry policy can place it elsewhere).
func (s *Server) enforceDrains(ctx context.Context) error {
	var touched []string
	err := s.store.Update(ctx, func(tx store.Tx) error {
		touched = touched[:0]
		nodes, err := tx.ListNodes()
		if err != nil {
			return err
		}
		now := s.now()
		for _, n := range nodes {
			if !n.Draining || n.DrainDeadline == nil || now.Before(*n.DrainDeadline) {
				continue
			}
			runs, err := tx.ListRuns(store.ListRunsOptions{NodeID: n.ID, Statuses: []string{api.RunPlaced, api.RunPreparing, api.RunRunning}})
			if err != nil {
				return err
			}
			for _, run := range runs {
				a := lifecycle.Current(&run.Run)
				if a == nil || a.NodeID != n.ID || !lifecycle.Active(*a) || a.StopRequested {
					continue
				}
				if err := s.issue(tx, n.ID, node.Command{Kind: node.KindStopWorkload, StopWorkload: &capability.StopWorkloadCommand{
					WorkloadKey: capability.WorkloadKey{RunID: run.ID, Attempt: a.Number}, Reason: "drained", GracePeriod: 10 * time.Second}}); err != nil {
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
