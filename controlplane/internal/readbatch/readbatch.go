// Package readbatch joins concurrent reads of one kind into batches: a
// caller's request waits while at most Slots batches are being read, and
// the next free slot reads every request queued by then in one go. Under
// light load a request is read alone and at once; under load the batches
// grow by themselves, so the store sees fewer, larger reads and no caller
// waits longer than the read in progress. It is the read-side sibling of
// package groupcommit: a replica's session streams woken together (one
// signal from another replica names many nodes) read their pending
// operations in one transaction and one statement, where each read was a
// transaction of its own.
//
// The package holds no store: the caller passes the read in. Only package
// controlplane may import it.
package readbatch

import (
	"context"
	"fmt"
	"sync"
)

// Batcher batches requests of type Q answered with R. Its zero value is
// not usable; call New. Safe for concurrent use.
type Batcher[Q, R any] struct {
	read  func(ctx context.Context, reqs []Q) ([]R, error)
	slots chan struct{} // one token per batch being read
	max   int

	mu    sync.Mutex
	queue []*call[Q, R]
}

type call[Q, R any] struct {
	req   Q
	taken bool          // a batch holds it (under Batcher.mu)
	done  chan struct{} // closed once answered
	ans   R
	err   error
}

// New returns a Batcher that reads with read, at most slots batches at a
// time and at most max requests a batch. read must answer every request
// of its batch, in order (an answer per request), or fail the whole batch;
// it is given the context of the caller whose turn it is to read, without
// its cancellation, since the other callers' answers ride on it.
func New[Q, R any](slots, max int, read func(ctx context.Context, reqs []Q) ([]R, error)) *Batcher[Q, R] {
	if slots < 1 || max < 1 {
		panic("readbatch: slots and max must be at least 1")
	}
	return &Batcher[Q, R]{read: read, slots: make(chan struct{}, slots), max: max}
}

// Read answers req, read alone or with whatever other requests are
// waiting. A request whose ctx ends before a batch takes it is withdrawn;
// once taken, it is answered even if ctx ends meanwhile, but Read returns
// ctx's error at once.
func (b *Batcher[Q, R]) Read(ctx context.Context, req Q) (R, error) {
	c := &call[Q, R]{req: req, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	for {
		b.mu.Lock()
		taken := c.taken
		b.mu.Unlock()
		if taken { // a batch holds it: only its answer is left to wait for
			select {
			case <-c.done:
				return c.ans, c.err
			case <-ctx.Done():
				var zero R
				return zero, ctx.Err()
			}
		}
		select {
		case <-c.done:
			return c.ans, c.err
		case b.slots <- struct{}{}:
			b.serve(ctx)
			<-b.slots
		case <-ctx.Done():
			b.mu.Lock()
			if !c.taken { // else a batch answers it, to nobody
				b.withdraw(c)
			}
			b.mu.Unlock()
			var zero R
			return zero, ctx.Err()
		}
	}
}

// serve reads the requests queued now (at most max) as one batch and
// answers each.
func (b *Batcher[Q, R]) serve(ctx context.Context) {
	b.mu.Lock()
	n := min(len(b.queue), b.max)
	batch := b.queue[:n:n]
	b.queue = append([]*call[Q, R](nil), b.queue[n:]...)
	for _, c := range batch {
		c.taken = true
	}
	b.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	reqs := make([]Q, len(batch))
	for i, c := range batch {
		reqs[i] = c.req
	}
	answers, err := b.read(context.WithoutCancel(ctx), reqs)
	if err == nil && len(answers) != len(reqs) {
		err = fmt.Errorf("readbatch: the read answered %d of %d requests", len(answers), len(reqs))
	}
	for i, c := range batch {
		if err != nil {
			c.err = err
		} else {
			c.ans = answers[i]
		}
		close(c.done)
	}
}

// withdraw removes c from the queue. The caller holds mu.
func (b *Batcher[Q, R]) withdraw(c *call[Q, R]) {
	for i, q := range b.queue {
		if q == c {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return
		}
	}
}
