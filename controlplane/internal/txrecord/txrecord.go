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

func (t *Tx) CreateRuns(runs []store.Run) error {
	if err := t.Tx.CreateRuns(runs); err != nil {
		return err
	}
	for _, r := range runs {
		t.note(r)
	}
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

// Memo is a store.Tx that keeps the runs and operations read and written
// through it, so that several events about one run in one batch (a
// launch's "preparing" observation and its result usually travel together)
// read the run once and write it once, when Flush is called. Reads return
// the latest version written through the memo, as a transaction would.
// Load and LoadOperations read many at once (store.Tx.GetRuns,
// GetOperations: one statement each on PostgreSQL, where a read per
// record was a round trip per record), so that a batch's reads cost a
// handful of statements whatever its size.
//
// An operation written through the memo that it has not read (a new
// command) goes straight to the store: only a read one is held for Flush.
type Memo struct {
	store.Tx
	runs  map[string]store.Run
	dirty map[string]bool
	ops   map[string]store.Operation
	// opsDirty are the read operations written back, to flush.
	opsDirty map[string]bool
}

func NewMemo(tx store.Tx) *Memo {
	return &Memo{Tx: tx, runs: map[string]store.Run{}, dirty: map[string]bool{},
		ops: map[string]store.Operation{}, opsDirty: map[string]bool{}}
}

// Load reads the runs among ids the memo does not hold yet, in one batch;
// missing ones are skipped (a later GetRun reports them).
func (m *Memo) Load(ids []string) error {
	runs, err := m.Tx.GetRuns(missing(ids, m.runs))
	for _, r := range runs {
		m.runs[r.ID] = r
	}
	return err
}

// LoadOperations is Load for operations.
func (m *Memo) LoadOperations(ids []string) error {
	ops, err := m.Tx.GetOperations(missing(ids, m.ops))
	for _, op := range ops {
		m.ops[op.ID] = op
	}
	return err
}

// missing is ids without those held.
func missing[T any](ids []string, held map[string]T) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if _, ok := held[id]; !ok {
			out = append(out, id)
		}
	}
	return out
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
func (m *Memo) GetRuns(ids []string) ([]store.Run, error) {
	if err := m.Load(ids); err != nil {
		return nil, err
	}
	return store.GetEach(ids, m.GetRun)
}

// PutRuns is PutRun for each, through the memo.
func (m *Memo) PutRuns(runs []store.Run) error { return store.Each(runs, m.PutRun) }

func (m *Memo) GetOperation(id string) (store.Operation, error) {
	if op, ok := m.ops[id]; ok {
		return op, nil
	}
	op, err := m.Tx.GetOperation(id)
	if err == nil {
		m.ops[id] = op
	}
	return op, err
}

// GetOperations is GetOperation for each (missing ones skipped), through
// the memo.
func (m *Memo) GetOperations(ids []string) ([]store.Operation, error) {
	if err := m.LoadOperations(ids); err != nil {
		return nil, err
	}
	return store.GetEach(ids, m.GetOperation)
}

func (m *Memo) PutOperation(op store.Operation) error {
	if _, read := m.ops[op.ID]; !read {
		return m.Tx.PutOperation(op)
	}
	m.ops[op.ID] = op
	m.opsDirty[op.ID] = true
	return nil
}

func (m *Memo) PutOperations(ops []store.Operation) error { return store.Each(ops, m.PutOperation) }

// Flush writes the runs and the read operations written through the
// memo, once each, in one batch of each (store.Tx.PutRuns, PutOperations).
func (m *Memo) Flush() error {
	if err := m.Tx.PutRuns(dirtyOf(m.runs, m.dirty)); err != nil {
		return err
	}
	clear(m.dirty)
	if err := m.Tx.PutOperations(dirtyOf(m.ops, m.opsDirty)); err != nil {
		return err
	}
	clear(m.opsDirty)
	return nil
}

// dirtyOf is the records of held named in dirty, in ID order.
func dirtyOf[T any](held map[string]T, dirty map[string]bool) []T {
	ids := make([]string, 0, len(dirty))
	for id := range dirty {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := make([]T, len(ids))
	for i, id := range ids {
		out[i] = held[id]
	}
	return out
}
