package schedcopy

import (
	"slices"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
)

// Queue is the leader's copy of the queued runs, kept between passes as
// Copy keeps the active ones, so that a pass does not read and decode the
// whole queue again: with a backlog of a hundred thousand runs that read
// was seconds a pass, and on PostgreSQL as many megabytes over the wire,
// whatever the pass then placed.
//
// It follows the replica's own writes as they commit (Note: a run that is
// queued is put in, any other status takes it out), reads again the runs
// other replicas wrote (MarkDirty, then Runs), and is rebuilt from the
// store when missing, when the replica becomes the leader (Invalidate) and
// every resync period, which bounds what a lost signal can cost: a new run
// placed late. An entry that is stale the other way (a run placed or
// cancelled elsewhere, still listed here) is harmless: every placement and
// every waiting reason is checked against the run's record in the
// transaction that writes it.
//
// The zero value is ready to use and holds nothing. Its methods are safe
// for concurrent use.
type Queue struct {
	mu      sync.Mutex
	runs    map[string]store.Run // by ID; nil until built
	sorted  []store.Run          // runs newest first, as the store lists them; nil once runs changed
	builtAt time.Time
	reading int         // reads of the store in flight
	invalid uint64      // Invalidate's count: a rebuild read across one is stale at once
	during  []store.Run // runs noted while one was, applied again after it
	dirty   map[string]bool
}

// Note applies runs this replica committed.
func (q *Queue) Note(runs map[string]store.Run) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, r := range runs {
		if q.reading > 0 {
			q.during = append(q.during, r)
		}
		q.apply(r)
	}
}

// apply puts one run's state in the copy, unless the copy holds a later
// version of it. The caller holds mu.
func (q *Queue) apply(r store.Run) {
	if q.runs == nil {
		return
	}
	cur, had := q.runs[r.ID]
	switch {
	case had && cur.UpdatedAt.After(r.UpdatedAt):
		return
	case r.Status == api.RunQueued:
		q.runs[r.ID] = r
	case had:
		delete(q.runs, r.ID)
	default:
		return
	}
	q.sorted = nil
}

// MarkDirty records runs another replica wrote: the next Runs reads them
// again. With no copy and none being read there is nothing to correct
// (the next Runs reads every queued run), and nothing is kept: a replica
// that does not schedule would otherwise keep every run ID the others
// wrote.
func (q *Queue) MarkDirty(ids []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.runs == nil && q.reading == 0 {
		return
	}
	if q.dirty == nil {
		q.dirty = map[string]bool{}
	}
	for _, id := range ids {
		q.dirty[id] = true
	}
}

// Invalidate drops the copy; the next Runs rebuilds it, and a rebuild in
// progress counts as already stale. Called when the replica becomes the
// leader (while it was not, it kept no copy) and when a signal was lost
// on the way (it may have named runs another replica wrote).
func (q *Queue) Invalidate() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.runs, q.sorted, q.builtAt = nil, nil, time.Time{}
	q.invalid++
}

// Runs returns the queued runs, newest first (store.Tx.ListRuns's order):
// rebuilt with readQueued when the copy is missing or older than resync,
// otherwise the copy with the runs other replicas wrote read again with
// readRuns (given their IDs sorted; it skips those no longer stored). The
// caller must not modify the slice or the runs. On an error the dirty runs
// stay dirty.
func (q *Queue) Runs(resync time.Duration, readQueued func() ([]store.Run, error), readRuns func(ids []string) ([]store.Run, error)) ([]store.Run, error) {
	q.mu.Lock()
	rebuild := q.runs == nil || time.Since(q.builtAt) > resync
	var dirty []string
	if rebuild {
		q.dirty = nil
	} else {
		for id := range q.dirty {
			dirty = append(dirty, id)
		}
		q.dirty = nil
	}
	if !rebuild && len(dirty) == 0 {
		defer q.mu.Unlock()
		return q.list(), nil
	}
	q.reading++
	invalid := q.invalid
	q.mu.Unlock()

	at := time.Now()
	var runs []store.Run
	var err error
	if rebuild {
		runs, err = readQueued()
	} else {
		slices.Sort(dirty)
		runs, err = readRuns(dirty)
	}

	q.mu.Lock()
	defer q.mu.Unlock()
	q.reading--
	during := q.during
	if q.reading == 0 {
		q.during = nil
	}
	if err != nil {
		if !rebuild {
			for _, id := range dirty {
				if q.dirty == nil {
					q.dirty = map[string]bool{}
				}
				q.dirty[id] = true
			}
		}
		return nil, err
	}
	if rebuild {
		if q.invalid != invalid { // invalidated during the read: rebuilt again next time
			at = time.Time{}
		}
		q.runs, q.sorted, q.builtAt = make(map[string]store.Run, len(runs)), nil, at
	}
	for _, r := range runs {
		q.apply(r)
	}
	for _, r := range during { // committed while the store was read
		q.apply(r)
	}
	return q.list(), nil
}

// list is the copy newest first. The caller holds mu.
func (q *Queue) list() []store.Run {
	if q.sorted == nil {
		q.sorted = make([]store.Run, 0, len(q.runs))
		for _, r := range q.runs {
			q.sorted = append(q.sorted, r)
		}
		slices.SortFunc(q.sorted, store.NewestFirst)
	}
	return q.sorted
}
