package controlplane

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Group commit. Every write transaction costs a commit (with SQLite, an
// fsync of its write-ahead log, on the one writer there is), so a thousand
// event batches a second cost a thousand commits. The hot write paths (node
// event batches, run submissions) go through batch instead of store.Update:
// transactions that arrive while another commit is in progress wait for it
// and then run together, one after the other inside one store.Update, and
// share its commit. Each caller still gets its own answer:
//
//   - The batch's transaction runs each caller's fn in turn, so each sees
//     the writes of those before it, exactly as if they had committed one
//     after the other; the store's isolation is unchanged.
//   - If any fn fails, nothing of the batch is kept, and every fn is run
//     again in a transaction of its own, so one caller's error (a refused
//     event, a conflict) never becomes another's. fn must therefore be
//     safe to run more than once, which the store.Store contract already
//     requires (Update may rerun fn on a serialization failure).
//   - A caller's answer is given only once its own writes committed.
//
// With one writer (SQLite) one batch runs at a time; a store that takes
// concurrent writers (PostgreSQL) gets Config.WriteConcurrency batches at
// once. A lone transaction does not wait for company: a batch is whatever
// queued while the previous one committed.

// maxBatch bounds the callers one transaction carries.
const maxBatch = 256

type batchJob struct {
	ctx  context.Context
	fn   func(tx store.Tx) error
	done chan error
	// locked: fn qualifies for store.UpdateLocked (batchLocked).
	locked bool
}

// run commits the job's fn in a transaction of its own.
func (j *batchJob) run(s *Server) error {
	if j.locked {
		return s.updateLocked(j.ctx, j.fn)
	}
	return s.update(j.ctx, j.fn)
}

// errBatchMember marks a batch abandoned because one of its members failed.
var errBatchMember = errors.New("a transaction in the batch failed")

// batch runs fn in a write transaction shared with concurrent callers (see
// above) and returns fn's error, or the store's. Runs fn wrote are noted
// for the scheduler (see update).
func (s *Server) batch(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.enqueue(&batchJob{ctx: ctx, fn: fn, done: make(chan error, 1)})
}

// batchLocked is batch for an fn that qualifies for store.UpdateLocked: it
// only reads records by key and writes them back. A batch of such jobs is
// committed through UpdateLocked; one mixed with others, through Update.
func (s *Server) batchLocked(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.enqueue(&batchJob{ctx: ctx, fn: fn, done: make(chan error, 1), locked: true})
}

func (s *Server) enqueue(j *batchJob) error {
	if !s.batching.Load() { // a Server used through Handler alone (tests)
		return j.run(s)
	}
	ctx := j.ctx
	select {
	case s.batches <- j:
	case <-ctx.Done():
		return ctx.Err()
	}
	return <-j.done // once taken, a job is answered however ctx ends
}

// batchLoop takes jobs and commits them in batches until ctx ends. The
// channel is unbuffered: a batch is the callers blocked handing in a job
// when the previous commit ended, and once no loop runs a caller's send
// waits only until its own context (the request's, which the server's
// ends) is done.
func (s *Server) batchLoop(ctx context.Context) {
	for {
		var first *batchJob
		select {
		case first = <-s.batches:
		case <-ctx.Done():
			return
		}
		jobs := []*batchJob{first}
	more:
		for len(jobs) < s.maxBatch() {
			select {
			case j := <-s.batches:
				jobs = append(jobs, j)
			default:
				break more
			}
		}
		s.runBatch(ctx, jobs)
	}
}

// maxBatch is maxBatch, or Config.WriteBatch when set.
func (s *Server) maxBatch() int {
	if s.cfg.WriteBatch > 0 {
		return s.cfg.WriteBatch
	}
	return maxBatch
}

// errBatchPanicked answers the callers of a batch that panicked.
var errBatchPanicked = errors.New("internal error: the write transaction panicked (logged by the server)")

func (s *Server) runBatch(ctx context.Context, jobs []*batchJob) {
	// A panic in a caller's fn (a bug) must not leave the batch's callers
	// waiting for ever: each job not answered yet is (done holds one answer,
	// so a job already answered keeps its own), and the panic goes on to the
	// loop's supervisor, which logs it and restarts the loop (Serve).
	defer func() {
		if v := recover(); v != nil {
			for _, j := range jobs {
				select {
				case j.done <- errBatchPanicked:
				default:
				}
			}
			panic(v)
		}
	}()
	live := jobs[:0]
	for _, j := range jobs {
		if err := j.ctx.Err(); err != nil {
			j.done <- err
			continue
		}
		live = append(live, j)
	}
	if len(live) == 1 {
		live[0].done <- live[0].run(s)
		return
	}
	if len(live) == 0 {
		return
	}
	// The batch's transaction is not any one caller's, so it is bounded by
	// the server's life and a deadline rather than by a caller's context.
	bctx, cancel := context.WithTimeout(ctx, time.Minute)
	commit := s.updateLocked
	for _, j := range live {
		if !j.locked {
			commit = s.update
		}
	}
	err := commit(bctx, func(tx store.Tx) error {
		for _, j := range live {
			if err := j.fn(tx); err != nil {
				return errBatchMember
			}
		}
		return nil
	})
	cancel()
	s.metrics.BatchSize.Observe(float64(len(live)))
	if err == nil {
		for _, j := range live {
			j.done <- nil
		}
		return
	}
	for _, j := range live {
		j.done <- j.run(s)
	}
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
	if op.Result == nil {
		if t.cmds == nil {
			t.cmds = map[string][]nodeproto.Command{}
		}
		t.cmds[op.NodeID] = append(t.cmds[op.NodeID], op.Command)
	}
	return nil
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

// flush writes the runs written through the memo, once each.
func (m *runMemo) flush() error {
	ids := make([]string, 0, len(m.dirty))
	for id := range m.dirty {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if err := m.Tx.PutRun(m.runs[id]); err != nil {
			return err
		}
	}
	clear(m.dirty)
	return nil
}
