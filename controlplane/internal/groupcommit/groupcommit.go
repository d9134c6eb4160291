// Package groupcommit commits concurrent write transactions together.
// Every write transaction costs a commit (with SQLite, an fsync of its
// write-ahead log, on the one writer there is), so a thousand event
// batches a second cost a thousand commits. The control plane's hot write
// paths (node event batches, run submissions) go through a Committer
// instead of the store: transactions that arrive while another commit is in
// progress wait for it and then run together, one after the other inside
// one transaction, and share its commit. Each caller still gets its own
// answer:
//
//   - The group's transaction runs each caller's fn in turn, so each sees
//     the writes of those before it, exactly as if they had committed one
//     after the other; the store's isolation is unchanged.
//   - If any fn fails, nothing of the group is kept, and every fn is run
//     again in a transaction of its own, so one caller's error (a refused
//     event, a conflict) never becomes another's. fn must therefore be
//     safe to run more than once, which the store.Store contract already
//     requires (Update may rerun fn on a serialization failure).
//   - A caller's answer is given only once its own writes committed.
//
// A caller may also say what its fn will read (UpdateWith): the group then
// makes the reads of all such callers together before running them (Share),
// so that a group of node event batches reads its runs in one statement,
// not one per batch, and writes them back in one.
//
// With one writer (SQLite) one group runs at a time; a store that takes
// concurrent writers (PostgreSQL) gets as many Run loops as it takes
// writers. A lone transaction does not wait for company: a group is
// whatever queued while the previous one committed.
//
// Only package controlplane imports it.
package groupcommit

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/store"
)

// DefaultMax bounds the callers one transaction carries.
const DefaultMax = 256

// Commit runs fn in a write transaction of its own: store.Store's Update
// or UpdateLocked, or a wrapper of one.
type Commit func(ctx context.Context, fn func(tx store.Tx) error) error

// Committer groups transactions. Its zero value is not usable; use New.
type Committer struct {
	update, updateLocked Commit
	max                  int
	observe              func(size int)
	share                Share
	jobs                 chan *job
	running              atomic.Bool
}

// Share makes, through tx, the reads that needs (one per caller of
// UpdateWith in a transaction, in the order their fns will run) name, all
// together, and returns the transaction those fns run in and finish, which
// writes back what they wrote through it and is called once they all
// succeeded, before the commit. It is called afresh for every transaction
// (a group's, a caller's own, a retried one), so what it keeps lives in
// shared and finish only.
type Share func(tx store.Tx, needs []any) (shared store.Tx, finish func() error, err error)

// SetShare sets how the needs of UpdateWith's callers are read together.
// Call it before Run and before any UpdateWith.
func (c *Committer) SetShare(share Share) { c.share = share }

// New is a Committer committing through update (any transaction) and
// updateLocked (one whose every fn qualifies for store.UpdateLocked), at
// most max callers a group (DefaultMax when max is 0 or less), telling
// observe the size of every group it commits together (nil: nobody).
func New(update, updateLocked Commit, max int, observe func(size int)) *Committer {
	if max <= 0 {
		max = DefaultMax
	}
	if observe == nil {
		observe = func(int) {}
	}
	return &Committer{update: update, updateLocked: updateLocked, max: max, observe: observe, jobs: make(chan *job)}
}

type job struct {
	ctx  context.Context
	fn   func(tx store.Tx) error
	done chan error
	// locked: fn qualifies for store.UpdateLocked.
	locked bool
	// need: what fn reads, for Share (UpdateWith); nil for a plain job.
	need any
}

// ErrPanicked answers the callers of a group whose transaction panicked.
var ErrPanicked = errors.New("internal error: the write transaction panicked (logged by the server)")

// errMember marks a group abandoned because one of its members failed.
var errMember = errors.New("a transaction in the group failed")

func (c *Committer) commitAlone(j *job) error {
	commit := c.update
	if j.locked {
		commit = c.updateLocked
	}
	if j.need == nil {
		return commit(j.ctx, j.fn)
	}
	return commit(j.ctx, func(tx store.Tx) error { return c.runShared(tx, []*job{j}) })
}

// runShared runs jobs, each of which has a need, in one transaction
// prepared by Share, and finishes it.
func (c *Committer) runShared(tx store.Tx, jobs []*job) error {
	if len(jobs) == 0 {
		return nil
	}
	needs := make([]any, len(jobs))
	for i, j := range jobs {
		needs[i] = j.need
	}
	shared, finish, err := c.share(tx, needs)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if err := j.fn(shared); err != nil {
			return err
		}
	}
	return finish()
}

// Update runs fn in a write transaction shared with concurrent callers and
// returns fn's error, or the store's. Before any Run loop started (a
// server used through its handler alone, in tests) it commits fn alone.
func (c *Committer) Update(ctx context.Context, fn func(tx store.Tx) error) error {
	return c.enqueue(&job{ctx: ctx, fn: fn, done: make(chan error, 1)})
}

// UpdateLocked is Update for an fn that qualifies for
// store.UpdateLocked: its group runs locked unless another caller in it
// does not qualify.
func (c *Committer) UpdateLocked(ctx context.Context, fn func(tx store.Tx) error) error {
	return c.enqueue(&job{ctx: ctx, fn: fn, done: make(chan error, 1), locked: true})
}

// UpdateWith is Update (UpdateLocked when locked) for an fn whose reads
// can be made together with other callers' (see Share): need says what fn
// will read, and fn runs in the transaction Share returned, once the needs
// of every such caller of its transaction have been read. A Committer
// without a Share refuses it (a programming error).
func (c *Committer) UpdateWith(ctx context.Context, need any, locked bool, fn func(tx store.Tx) error) error {
	if c.share == nil || need == nil {
		return errors.New("internal error: groupcommit.UpdateWith needs a Share and a need")
	}
	return c.enqueue(&job{ctx: ctx, fn: fn, done: make(chan error, 1), locked: locked, need: need})
}

// Running reports whether a Run loop has started.
func (c *Committer) Running() bool { return c.running.Load() }

func (c *Committer) enqueue(j *job) error {
	if !c.running.Load() {
		return c.commitAlone(j)
	}
	select {
	case c.jobs <- j:
	case <-j.ctx.Done():
		return j.ctx.Err()
	}
	return <-j.done // once taken, a job is answered however ctx ends
}

// Run takes callers and commits them in groups until ctx ends. The
// hand-over is unbuffered: a group is the callers blocked handing in
// their transaction when the previous commit ended, and once no loop runs
// a caller waits only until its own context (the request's, which the
// server's ends) is done. A panic in a caller's fn (a bug) first answers
// every caller of its group not answered yet (ErrPanicked), then goes on
// to Run's caller, whose supervisor logs it and runs Run again.
func (c *Committer) Run(ctx context.Context) {
	c.running.Store(true)
	for {
		var first *job
		select {
		case first = <-c.jobs:
		case <-ctx.Done():
			return
		}
		jobs := []*job{first}
	more:
		for len(jobs) < c.max {
			select {
			case j := <-c.jobs:
				jobs = append(jobs, j)
			default:
				break more
			}
		}
		c.commit(ctx, jobs)
	}
}

func (c *Committer) commit(ctx context.Context, jobs []*job) {
	defer func() {
		if v := recover(); v != nil {
			for _, j := range jobs {
				select {
				case j.done <- ErrPanicked:
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
	switch len(live) {
	case 0:
		return
	case 1:
		live[0].done <- c.commitAlone(live[0])
		return
	}
	// The group's transaction is not any one caller's, so it is bounded by
	// the server's life and a deadline rather than by a caller's context.
	gctx, cancel := context.WithTimeout(ctx, time.Minute)
	commit := c.updateLocked
	for _, j := range live {
		if !j.locked {
			commit = c.update
		}
	}
	// The callers with a need run first, together (runShared), then the
	// others on the plain transaction: the shared one holds writes until
	// its finish, which a plain fn's reads must see. Concurrent callers
	// have no order of their own, so any order is one they could have
	// committed in.
	var shared, plain []*job
	for _, j := range live {
		if j.need != nil {
			shared = append(shared, j)
		} else {
			plain = append(plain, j)
		}
	}
	err := commit(gctx, func(tx store.Tx) error {
		if err := c.runShared(tx, shared); err != nil {
			return errMember
		}
		for _, j := range plain {
			if err := j.fn(tx); err != nil {
				return errMember
			}
		}
		return nil
	})
	cancel()
	c.observe(len(live))
	if err == nil {
		for _, j := range live {
			j.done <- nil
		}
		return
	}
	for _, j := range live {
		j.done <- c.commitAlone(j)
	}
}
