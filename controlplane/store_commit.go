package controlplane

import (
	"context"

	"github.com/mercator/mercator/controlplane/internal/txrecord"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// batch runs fn in a write transaction shared with concurrent callers
// (package groupcommit) and returns fn's error, or the store's. Runs fn
// wrote are noted for the scheduler (see update).
func (s *Server) batch(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.commits.Update(ctx, fn)
}

// batchLocked is batch for an fn that qualifies for store.UpdateLocked
// (it reads records by key and writes them back): on PostgreSQL its
// group then runs under READ COMMITTED with row locks, outside the
// serializable conflict checks.
func (s *Server) batchLocked(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.commits.UpdateLocked(ctx, fn)
}

// update is store.Update, noting every run and node fn wrote so that, once
// the transaction committed, the reconcile loop's copies follow
// (schedcopy.Copy.NoteRuns, PatchNodes) and other replicas hear
// which runs changed. Every write of a run or a node's record in the
// control plane goes through update (or batch), except liveness flushes
// (package liveness), which the copies do not need.
func (s *Server) update(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.write(ctx, s.store.Update, fn)
}

// updateLocked is update through store.UpdateLocked, for transactions that
// only read records by key and write them back (placements, node events):
// see store.Store.UpdateLocked for what that promises and why.
func (s *Server) updateLocked(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.write(ctx, s.store.UpdateLocked, fn)
}

func (s *Server) write(ctx context.Context, run func(context.Context, func(store.Tx) error) error, fn func(tx store.Tx) error) error {
	var rt *txrecord.Tx
	err := run(ctx, func(tx store.Tx) error {
		rt = txrecord.New(tx)
		return fn(rt)
	})
	if err == nil && rt != nil && len(rt.Runs) > 0 {
		s.runsWritten(rt.Runs)
	}
	if err == nil && rt != nil && len(rt.Nodes) > 0 {
		s.sched.PatchNodes(rt.Nodes)
		s.fleetCache.Forget("")
	}
	if err == nil && rt != nil {
		for id, cmds := range rt.Cmds {
			s.handOver(id, cmds)
		}
	}
	return err
}

// handOver hands commands just committed for a node to its session streams
// on this replica, which send them without reading the store
// (deliverLocal), and has streams elsewhere read it; with no stream here,
// it wakes the node's streams wherever they are.
func (s *Server) handOver(nodeID string, cmds []nodeproto.Command) {
	if s.deliverLocal(nodeID, cmds) {
		s.publish(topicNode + nodeID)
	} else {
		s.nodeChanged(nodeID)
	}
}
