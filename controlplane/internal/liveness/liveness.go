// Package liveness is how the control plane knows which nodes are alive.
// The control plane learns that a node is alive from every call
// the node makes (heartbeats, event batches, session opens). Writing that
// to the node's record on every call made each heartbeat a write
// transaction, and judging it meant decoding every node's record: at ten
// thousand nodes heartbeating every 10s, a thousand write transactions a
// second on the store's single writer (SQLite), and most of a core. So:
//
//   - Each replica keeps, in memory, the moment it last heard from each
//     node (Tracker.seen). A heartbeat touches only that.
//   - Every flush period (livenessFlush: a twentieth of the lease, between
//     20ms and 1s) the replica writes what it heard since the last flush to
//     the nodes' records (store.Node.LastSeenAt), in batched transactions
//     that never move a LastSeenAt backwards. That is how other replicas,
//     and this one after a restart, learn of those reports. The write is
//     narrow (store.Tx.NodesSeen): the moment alone, never the record,
//     which at 10,000 8-GPU nodes cost 0.17 (PostgreSQL) to 0.41 (SQLite)
//     of decoding and rewriting each record (BenchmarkFlush10k).
//   - A node's status is judged on the freshest moment known: this
//     replica's memory or the record. A record may lag the truth by the
//     flush period, and the copy of the records a decision reads (the
//     reconcile loop keeps one, refreshed at most every flush period) by as
//     much again. So a node is unreachable only when nothing was heard from
//     it for Lease + livenessGrace (twice the flush period). The grace can
//     make an expiry late by that much, never early: a node that reported
//     to any replica within its lease is not judged unreachable.
//   - A restarted replica has lost its memory; the records hold every
//     report up to one flush period before the crash, which the grace
//     covers. A replica killed before it flushed loses at most one flush
//     period of reports, which the node's next heartbeat (a third of the
//     lease at most) replaces.
//
// The lapse count (mercator_node_lease_lapses_total) is kept at flush time:
// a node whose first report in a flush window came more than a lease after
// the last one known (this replica's memory or the record) was unreachable
// in between.
//
// Only package controlplane may import it.
package liveness

import (
	"context"
	"hash/fnv"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/mercator/mercator/store"
)

// livenessChunk bounds the nodes one flush transaction writes, so a flush
// never holds SQLite's single writer for long.
const livenessChunk = 500

// Tracker is one replica's memory of when it heard from each node. Safe
// for concurrent use.
type Tracker struct {
	lease time.Duration
	flush time.Duration
	// Reports arrive from every node's calls at once; a lock per shard
	// keeps them from queueing on one.
	shards [livenessShards]livenessShard
}

const livenessShards = 64

type livenessShard struct {
	mu      sync.Mutex
	seen    map[string]time.Time   // the last report this replica heard
	pending map[string]pendingSeen // heard since the last flush
}

// pendingSeen is what a flush writes for one node: the window's first and
// last reports, and what this replica had heard before the window.
type pendingSeen struct {
	first, last time.Time
	before      time.Time // zero when this replica had heard nothing
}

// New returns a tracker for nodes whose lease is lease; its flush period
// is a twentieth of it, between 20ms and 1s.
func New(lease time.Duration) *Tracker {
	flush := min(max(lease/20, 20*time.Millisecond), time.Second)
	l := &Tracker{lease: lease, flush: flush}
	for i := range l.shards {
		l.shards[i] = livenessShard{seen: map[string]time.Time{}, pending: map[string]pendingSeen{}}
	}
	return l
}

func (l *Tracker) shard(nodeID string) *livenessShard {
	h := fnv.New32a()
	h.Write([]byte(nodeID))
	return &l.shards[h.Sum32()%livenessShards]
}

// FlushPeriod is how often the tracker writes what it heard to the store.
func (l *Tracker) FlushPeriod() time.Duration { return l.flush }

// Grace is how far a judgement of liveness may trail the truth (see above).
func (l *Tracker) Grace() time.Duration { return 2 * l.flush }

// Report records that the node was heard from at at.
func (l *Tracker) Report(nodeID string, at time.Time) {
	sh := l.shard(nodeID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	prev := sh.seen[nodeID]
	if at.After(prev) {
		sh.seen[nodeID] = at
	}
	p, ok := sh.pending[nodeID]
	if !ok {
		p = pendingSeen{first: at, before: prev}
	}
	if at.After(p.last) {
		p.last = at
	}
	sh.pending[nodeID] = p
}

// LastSeen is the freshest of this replica's memory and the record's
// moment; nil when neither knows one.
func (l *Tracker) LastSeen(n store.Node) *time.Time {
	sh := l.shard(n.ID)
	sh.mu.Lock()
	mem, ok := sh.seen[n.ID]
	sh.mu.Unlock()
	if !ok || (n.LastSeenAt != nil && !mem.After(*n.LastSeenAt)) {
		return n.LastSeenAt
	}
	return &mem
}

// Snapshot copies this replica's memory of every node, for a pass that
// judges the whole fleet (one lock per shard rather than one per node).
func (l *Tracker) Snapshot() map[string]time.Time {
	out := map[string]time.Time{}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for id, t := range sh.seen {
			out[id] = t
		}
		sh.mu.Unlock()
	}
	return out
}

// take hands the pending reports to a flush.
func (l *Tracker) take() map[string]pendingSeen {
	out := map[string]pendingSeen{}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for id, p := range sh.pending {
			out[id] = p
		}
		clear(sh.pending)
		sh.mu.Unlock()
	}
	return out
}

// putBack returns reports a flush could not write, for the next one.
func (l *Tracker) putBack(batch map[string]pendingSeen) {
	for id, p := range batch {
		sh := l.shard(id)
		sh.mu.Lock()
		q, ok := sh.pending[id]
		switch {
		case !ok:
			q = p
		default:
			if p.first.Before(q.first) {
				q.first, q.before = p.first, p.before
			}
			if p.last.After(q.last) {
				q.last = p.last
			}
		}
		sh.pending[id] = q
		sh.mu.Unlock()
	}
}

// Flusher is where a tracker writes what it heard: the store, a logger
// for writes that fail (they are retried at the next flush), and the
// count of lease lapses found.
type Flusher struct {
	Store  store.Store
	Log    *slog.Logger
	Lapses func(n int)
}

// FlushLoop writes liveness to f.Store every flush period until ctx ends,
// and once more then.
func (l *Tracker) FlushLoop(ctx context.Context, f Flusher) {
	t := time.NewTicker(l.flush)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			l.flushOnce(final, f)
			cancel()
			return
		case <-t.C:
			l.flushOnce(ctx, f)
		}
	}
}

// flushOnce writes the reports heard since the last flush to the nodes'
// records and counts lease lapses. What it cannot write is kept for the
// next flush.
func (l *Tracker) flushOnce(ctx context.Context, f Flusher) {
	batch := l.take()
	if len(batch) == 0 {
		return
	}
	ids := make([]string, 0, len(batch))
	for id := range batch {
		ids = append(ids, id)
	}
	sort.Strings(ids) // a stable order of row writes, kinder to PostgreSQL's locks
	for start := 0; start < len(ids); start += livenessChunk {
		chunk := ids[start:min(start+livenessChunk, len(ids))]
		lapses := 0
		// UpdateLocked, as NodesSeen qualifies (it locks the moments it
		// reads): on PostgreSQL a flush then runs under READ COMMITTED and
		// takes no part in serializable transactions' conflict checks.
		// Run serializable, its reads of up to livenessChunk nodes were
		// escalated to a read lock on whole tables, and every enrollment,
		// invitation and fact report that wrote a node meanwhile conflicted
		// with it and ran again.
		err := f.Store.UpdateLocked(ctx, func(tx store.Tx) error {
			lapses = 0
			seen := make(map[string]time.Time, len(chunk))
			for _, id := range chunk {
				seen[id] = batch[id].last
			}
			// The narrow write: the moments alone, never the records.
			before, err := tx.NodesSeen(seen)
			if err != nil {
				return err
			}
			for id, recorded := range before {
				p := batch[id]
				known := p.before
				if recorded.After(known) {
					known = recorded
				}
				if !known.IsZero() && p.first.Sub(known) > l.lease {
					lapses++
				}
			}
			return nil
		})
		if err != nil {
			rest := map[string]pendingSeen{}
			for _, id := range ids[start:] {
				rest[id] = batch[id]
			}
			l.putBack(rest)
			if ctx.Err() == nil {
				f.Log.Warn("write node liveness; will retry", "nodes", len(rest), "err", err)
			}
			return
		}
		f.Lapses(lapses)
	}
}
