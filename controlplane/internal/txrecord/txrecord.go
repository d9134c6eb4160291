// Package txrecord holds the store.Tx wrappers the control plane writes
// through: Tx records what a transaction wrote (runs, nodes, commands) so
// that, once it committed, the scheduler's copies follow and the commands
// reach their nodes' sessions; Memo lets the events of one batch about one
// run read it once and write it once.
//
// Only package controlplane imports it.
package txrecord

import (
	"sort"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Tx is a store.Tx that remembers the runs and nodes written through
// it, the last version of each, and the commands issued through it (pending
// operations), which the control plane delivers once the transaction
// committed: every path that issues a command (a placement, a stop, a
// prepare) reaches the node's session at once, not at its next read of the
// store.
type Tx struct {
	store.Tx
	Runs  map[string]store.Run
	Nodes map[string]store.Node
	Cmds  map[string][]nodeproto.Command // by node
}

// New wraps tx.
func New(tx store.Tx) *Tx { return &Tx{Tx: tx} }

func (t *Tx) PutOperation(op store.Operation) error {
	if err := t.Tx.PutOperation(op); err != nil {
		return err
	}
	t.noteOp(op)
	return nil
}

func (t *Tx) PutOperations(ops []store.Operation) error {
	if err := t.Tx.PutOperations(ops); err != nil {
		return err
	}
	for _, op := range ops {
		t.noteOp(op)
	}
	return nil
}

func (t *Tx) noteOp(op store.Operation) {
	if op.Result == nil {
		if t.Cmds == nil {
			t.Cmds = map[string][]nodeproto.Command{}
		}
		t.Cmds[op.NodeID] = append(t.Cmds[op.NodeID], op.Command)
	}
}

func (t *Tx) PutNode(n store.Node) error {
	if err := t.Tx.PutNode(n); err != nil {
		return err
	}
	if t.Nodes == nil {
		t.Nodes = map[string]store.Node{}
	}
	t.Nodes[n.ID] = n
	return nil
}

func (t *Tx) note(r store.Run) {
	if t.Runs == nil {
		t.Runs = map[string]store.Run{}
	}
	r.Attempts = append([]api.Attempt(nil), r.Attempts...) // the caller may reuse its slice
	t.Runs[r.ID] = r
}

func (t *Tx) CreateRun(r store.Run) error {
	if err := t.Tx.CreateRun(r); err != nil {
		return err
	}
	t.note(r)
	return nil
}

func (t *Tx) PutRun(r store.Run) error {
	if err := t.Tx.PutRun(r); err != nil {
		return err
	}
	t.note(r)
	return nil
}

func (t *Tx) PutRuns(runs []store.Run) error {
	if err := t.Tx.PutRuns(runs); err != nil {
		return err
	}
	for _, r := range runs {
		t.note(r)
	}
	return nil
}

// Memo is a store.Tx that keeps the runs read and written through it,
// so that several events about one run in one batch (a launch's
// "preparing" observation and its result usually travel together) read the
// run once and write it once, when flush is called. Reads of a run return
// the latest version written through the memo, as a transaction would.
type Memo struct {
	store.Tx
	runs  map[string]store.Run
	dirty map[string]bool
}

func NewMemo(tx store.Tx) *Memo {
	return &Memo{Tx: tx, runs: map[string]store.Run{}, dirty: map[string]bool{}}
}

func (m *Memo) GetRun(id string) (store.Run, error) {
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

func (m *Memo) PutRun(r store.Run) error {
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
func (m *Memo) GetRuns(ids []string) ([]store.Run, error) { return store.GetEach(ids, m.GetRun) }

// PutRuns is PutRun for each, through the memo.
func (m *Memo) PutRuns(runs []store.Run) error {
	for _, r := range runs {
		if err := m.PutRun(r); err != nil {
			return err
		}
	}
	return nil
}

// Flush writes the runs written through the memo, once each, in one batch
// (store.Tx.PutRuns).
func (m *Memo) Flush() error {
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
