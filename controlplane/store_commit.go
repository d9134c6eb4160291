package controlplane

import (
	"context"
	"errors"
	"slices"
	"sort"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// batch runs fn in a write transaction shared with concurrent callers
// (package groupcommit) and returns fn's error, or the store's. Runs fn
// wrote are noted for the scheduler (see update).
func (s *Server) batch(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.commits.Update(ctx, fn)
}

// batchLocked is batch for an fn that qualifies for store.UpdateLocked: it
// only reads records by key and writes them back.
func (s *Server) batchLocked(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.commits.UpdateLocked(ctx, fn)
}

// update is store.Update, noting every run and node fn wrote so that, once
// the transaction committed, the reconcile loop's copies follow
// (schedState.noteRuns, schedState.patchNodes) and other replicas hear
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
	var rt *runTx
	err := run(ctx, func(tx store.Tx) error {
		rt = &runTx{Tx: tx}
		return fn(rt)
	})
	if err == nil && rt != nil && len(rt.runs) > 0 {
		s.runsWritten(rt.runs)
	}
	if err == nil && rt != nil && len(rt.nodes) > 0 {
		s.sched.patchNodes(rt.nodes)
	}
	if err == nil && rt != nil {
		for id, cmds := range rt.cmds {
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

// runTx is a store.Tx that remembers the runs and nodes written through
// it, the last version of each, and the commands issued through it (pending
// operations), which write delivers once the transaction committed: every
// path that issues a command (a placement, a stop, a prepare) reaches the
// node's session at once, not at its next read of the store.
type runTx struct {
	store.Tx
	runs  map[string]store.Run
	nodes map[string]store.Node
	cmds  map[string][]nodeproto.Command // by node
}

func (t *runTx) PutOperation(op store.Operation) error {
	if err := t.Tx.PutOperation(op); err != nil {
		return err
	}
	t.noteOp(op)
	return nil
}

func (t *runTx) PutOperations(ops []store.Operation) error {
	if err := t.Tx.PutOperations(ops); err != nil {
		return err
	}
	for _, op := range ops {
		t.noteOp(op)
	}
	return nil
}

func (t *runTx) noteOp(op store.Operation) {
	if op.Result == nil {
		if t.cmds == nil {
			t.cmds = map[string][]nodeproto.Command{}
		}
		t.cmds[op.NodeID] = append(t.cmds[op.NodeID], op.Command)
	}
}

func (t *runTx) PutNode(n store.Node) error {
	if err := t.Tx.PutNode(n); err != nil {
		return err
	}
	if t.nodes == nil {
		t.nodes = map[string]store.Node{}
	}
	t.nodes[n.ID] = n
	return nil
}

func (t *runTx) note(r store.Run) {
	if t.runs == nil {
		t.runs = map[string]store.Run{}
	}
	r.Attempts = append([]api.Attempt(nil), r.Attempts...) // the caller may reuse its slice
	t.runs[r.ID] = r
}

func (t *runTx) CreateRun(r store.Run) error {
	if err := t.Tx.CreateRun(r); err != nil {
		return err
	}
	t.note(r)
	return nil
}

func (t *runTx) PutRun(r store.Run) error {
	if err := t.Tx.PutRun(r); err != nil {
		return err
	}
	t.note(r)
	return nil
}

func (t *runTx) PutRuns(runs []store.Run) error {
	if err := t.Tx.PutRuns(runs); err != nil {
		return err
	}
	for _, r := range runs {
		t.note(r)
	}
	return nil
}

// runMemo is a store.Tx that keeps the runs read and written through it,
// so that several events about one run in one batch (a launch's
// "preparing" observation and its result usually travel together) read the
// run once and write it once, when flush is called. Reads of a run return
// the latest version written through the memo, as a transaction would.
type runMemo struct {
	store.Tx
	runs  map[string]store.Run
	dirty map[string]bool
}

func newRunMemo(tx store.Tx) *runMemo {
	return &runMemo{Tx: tx, runs: map[string]store.Run{}, dirty: map[string]bool{}}
}

func (m *runMemo) GetRun(id string) (store.Run, error) {
	r, ok := m.runs[id]
	if !ok {
		var err error
		if r, err = m.Tx.GetRun(id); err != nil {
			return r, err
		}
		m.runs[id] = r
	}
	r.Attempts = append([]api.Attempt(nil), r.Attempts...) // the caller owns what it gets
	return r, nil
}

func (m *runMemo) PutRun(r store.Run) error {
	if _, ok := m.runs[r.ID]; !ok {
		if _, err := m.Tx.GetRun(r.ID); err != nil {
			return err // PutRun replaces an existing run only
		}
	}
	r.Attempts = append([]api.Attempt(nil), r.Attempts...)
	m.runs[r.ID] = r
	m.dirty[r.ID] = true
	return nil
}

// GetRuns is GetRun for each (missing ones skipped), through the memo.
func (m *runMemo) GetRuns(ids []string) ([]store.Run, error) {
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	out := make([]store.Run, 0, len(ids))
	for _, id := range ids {
		r, err := m.GetRun(id)
		if errors.Is(err, failure.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// PutRuns is PutRun for each, through the memo.
func (m *runMemo) PutRuns(runs []store.Run) error {
	for _, r := range runs {
		if err := m.PutRun(r); err != nil {
			return err
		}
	}
	return nil
}

// flush writes the runs written through the memo, once each, in one batch
// (store.Tx.PutRuns).
func (m *runMemo) flush() error {
	ids := make([]string, 0, len(m.dirty))
	for id := range m.dirty {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	runs := make([]store.Run, len(ids))
	for i, id := range ids {
		runs[i] = m.runs[id]
	}
	if err := m.Tx.PutRuns(runs); err != nil {
		return err
	}
	clear(m.dirty)
	return nil
}
