package liveness

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// The tracker takes every moment as an argument, so these tests are the
// clock: nothing here sleeps or reads the wall clock.

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// replica is one control-plane replica's tracker over the shared store,
// with the lapses its flushes counted.
type replica struct {
	*Tracker
	f      Flusher
	lapses int
}

func newReplica(st store.Store, lease time.Duration) *replica {
	r := &replica{Tracker: New(lease)}
	r.f = Flusher{Store: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Lapses: func(n int) { r.lapses += n }}
	return r
}

func (r *replica) flush() { r.flushOnce(context.Background(), r.f) }

func newStore(t *testing.T, ids ...string) store.Store {
	t.Helper()
	st := memstore.New()
	if err := st.Update(context.Background(), func(tx store.Tx) error {
		for _, id := range ids {
			if err := tx.PutNode(store.Node{ID: id, CreatedAt: t0}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return st
}

func record(t *testing.T, st store.Store, id string) store.Node {
	t.Helper()
	var n store.Node
	if err := st.View(context.Background(), func(tx store.Tx) error {
		var err error
		n, err = tx.GetNode(id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func lastSeen(t *testing.T, st store.Store, id string) time.Time {
	t.Helper()
	n := record(t, st, id)
	if n.LastSeenAt == nil {
		return time.Time{}
	}
	return *n.LastSeenAt
}

func TestFlushPeriodAndGrace(t *testing.T) {
	for _, c := range []struct{ lease, flush time.Duration }{
		{100 * time.Millisecond, 20 * time.Millisecond}, // a twentieth would be 5ms: the floor
		{10 * time.Second, 500 * time.Millisecond},
		{time.Hour, time.Second}, // the ceiling
	} {
		tr := New(c.lease)
		if tr.FlushPeriod() != c.flush || tr.Grace() != 2*c.flush {
			t.Errorf("lease %v: flush %v, grace %v; want %v and twice that", c.lease, tr.FlushPeriod(), tr.Grace(), c.flush)
		}
	}
}

// TestFlushWritesReportsNeverBackwards: a flush writes the latest report
// of each node to its record, skips nodes the store does not hold, and
// never moves a record's moment backwards (another replica may have
// written a later one); what was flushed is not written again.
func TestFlushWritesReportsNeverBackwards(t *testing.T) {
	st := newStore(t, "a", "b")
	r := newReplica(st, 10*time.Second)
	r.Report("a", t0)
	r.Report("a", t0.Add(2*time.Second))
	r.Report("a", t0.Add(time.Second)) // late arrival of an earlier call
	r.Report("ghost", t0)              // deleted meanwhile
	if got := lastSeen(t, st, "a"); !got.IsZero() {
		t.Fatalf("record written before a flush: %v", got)
	}
	r.flush()
	if got := lastSeen(t, st, "a"); !got.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("after a flush, a's record = %v, want the latest report %v", got, t0.Add(2*time.Second))
	}
	// Another replica wrote a later moment for b; this replica's older
	// report must not move it back.
	later := t0.Add(5 * time.Second)
	if err := st.Update(context.Background(), func(tx store.Tx) error {
		n, err := tx.GetNode("b")
		if err != nil {
			return err
		}
		n.LastSeenAt = &later
		return tx.PutNode(n)
	}); err != nil {
		t.Fatal(err)
	}
	r.Report("b", t0.Add(time.Second))
	r.flush()
	if got := lastSeen(t, st, "b"); !got.Equal(later) {
		t.Fatalf("b's record = %v, want %v kept (a flush moved it backwards)", got, later)
	}
	if len(r.take()) != 0 {
		t.Fatal("reports still pending after a flush")
	}
}

// failingStore fails every write while fail is set.
type failingStore struct {
	store.Store
	fail bool
}

func (f *failingStore) Update(ctx context.Context, fn func(store.Tx) error) error {
	if f.fail {
		return errors.New("store unavailable")
	}
	return f.Store.Update(ctx, fn)
}

func (f *failingStore) UpdateLocked(ctx context.Context, fn func(store.Tx) error) error {
	if f.fail {
		return errors.New("store unavailable")
	}
	return f.Store.UpdateLocked(ctx, fn)
}

// TestFailedFlushRetried: reports a flush could not write are kept and
// written by the next flush, merged with what arrived meanwhile (the
// latest of both wins).
func TestFailedFlushRetried(t *testing.T) {
	fs := &failingStore{Store: newStore(t, "a"), fail: true}
	r := newReplica(fs, 10*time.Second)
	r.Report("a", t0)
	r.flush()
	fs.fail = false
	if got := lastSeen(t, fs, "a"); !got.IsZero() {
		t.Fatalf("record %v after a failed flush", got)
	}
	r.flush()
	if got := lastSeen(t, fs, "a"); !got.Equal(t0) {
		t.Fatalf("after the retry, record = %v, want %v", got, t0)
	}
	fs.fail = true
	r.Report("a", t0.Add(time.Second))
	r.flush()
	fs.fail = false
	r.Report("a", t0.Add(500*time.Millisecond)) // a slower call, answered after
	r.flush()
	if got := lastSeen(t, fs, "a"); !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("after the retry, record = %v, want %v", got, t0.Add(time.Second))
	}
}

// TestFlushLoopFlushesOnShutdown: what was heard since the last flush is
// written when the loop ends, so a replica stopped cleanly loses nothing.
func TestFlushLoopFlushesOnShutdown(t *testing.T) {
	st := newStore(t, "a")
	r := newReplica(st, time.Hour) // a 1s period: the ticker cannot fire first
	r.Report("a", t0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.FlushLoop(ctx, r.f)
	if got := lastSeen(t, st, "a"); !got.Equal(t0) {
		t.Fatalf("record after shutdown = %v, want %v", got, t0)
	}
}

// TestReplicasShareThroughTheRecord: a node heard by one replica is known
// to another once flushed; each judges on the freshest of its memory and
// the record; and a lapse is counted once, by the replica that hears the
// node after more than a lease of silence, whichever replica heard it
// last.
func TestReplicasShareThroughTheRecord(t *testing.T) {
	const lease = 10 * time.Second
	st := newStore(t, "n")
	a, b := newReplica(st, lease), newReplica(st, lease)

	a.Report("n", t0)
	if got := b.LastSeen(record(t, st, "n")); got != nil {
		t.Fatalf("b knows %v before a flushed", got)
	}
	a.flush()
	if got := b.LastSeen(record(t, st, "n")); got == nil || !got.Equal(t0) {
		t.Fatalf("b's LastSeen after a flushed = %v, want %v", got, t0)
	}
	// b's own later memory wins over the record, before b flushes it.
	b.Report("n", t0.Add(lease))
	if got := b.LastSeen(record(t, st, "n")); got == nil || !got.Equal(t0.Add(lease)) {
		t.Fatalf("b's LastSeen = %v, want its memory %v", got, t0.Add(lease))
	}
	// Exactly a lease after a's report: no lapse.
	b.flush()
	if a.lapses+b.lapses != 0 {
		t.Fatalf("lapses %d+%d after a report a lease apart, want none", a.lapses, b.lapses)
	}
	// a heard nothing since t0 in its memory, but the record says b heard
	// the node at t0+lease: a report at t0+lease+1s is no lapse.
	a.Report("n", t0.Add(lease+time.Second))
	a.flush()
	if a.lapses != 0 {
		t.Fatalf("a counted %d lapses; the record shows b heard the node within the lease", a.lapses)
	}
	// More than a lease of silence, then b hears it: one lapse.
	b.Report("n", t0.Add(2*lease+2*time.Second))
	b.flush()
	if a.lapses != 0 || b.lapses != 1 {
		t.Fatalf("lapses a=%d b=%d after more than a lease of silence, want b=1", a.lapses, b.lapses)
	}
}
