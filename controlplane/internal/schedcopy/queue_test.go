package schedcopy

import (
	"errors"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
)

func queued(id string, created, updated time.Time) store.Run {
	return store.Run{Run: api.Run{ID: id, Status: api.RunQueued, CreatedAt: created, UpdatedAt: updated}}
}

func ids(runs []store.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.ID
	}
	return out
}

func sameIDs(t *testing.T, what string, got []store.Run, want ...string) {
	t.Helper()
	g := ids(got)
	if len(g) != len(want) {
		t.Fatalf("%s: %v, want %v", what, g, want)
	}
	for i := range g {
		if g[i] != want[i] {
			t.Fatalf("%s: %v, want %v", what, g, want)
		}
	}
}

// TestQueueFollowsWrites holds the copy of the queued runs to the store it
// stands for: built whole once, then this replica's writes (queued in,
// anything else out, an older version never over a newer one), the runs
// other replicas wrote read again by ID (kept dirty when that read fails),
// a rebuild after the resync period or Invalidate, newest first throughout
// as the store lists them.
func TestQueueFollowsWrites(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var q Queue
	stored := []store.Run{queued("b", at(2), at(2)), queued("a", at(1), at(1))}
	reads := 0
	whole := func() ([]store.Run, error) { reads++; return stored, nil }
	byID := func(ids []string) ([]store.Run, error) {
		t.Fatalf("read %v by ID, nothing dirty", ids)
		return nil, nil
	}

	got, err := q.Runs(time.Hour, whole, byID)
	if err != nil || reads != 1 {
		t.Fatalf("first Runs: %v, %d reads", err, reads)
	}
	sameIDs(t, "built", got, "b", "a")
	if got, _ = q.Runs(time.Hour, whole, byID); reads != 1 {
		t.Fatalf("a second Runs read the store again")
	}

	// This replica submits c and places a; an older version of b (queued
	// with another reason) arrives after its newer one and is ignored.
	placed := placedAt("a", at(1), at(5))
	newer := queued("b", at(2), at(6))
	newer.Reason = "newer"
	q.Note(map[string]store.Run{"c": queued("c", at(3), at(3)), "a": placed, "b": newer})
	q.Note(map[string]store.Run{"b": queued("b", at(2), at(4))})
	got, _ = q.Runs(time.Hour, whole, byID)
	sameIDs(t, "after this replica's writes", got, "c", "b")
	if got[1].Reason != "newer" {
		t.Fatalf("an older version replaced a newer one: %+v", got[1])
	}

	// Another replica submitted d and cancelled c; the first read of them
	// fails and they stay dirty.
	q.MarkDirty([]string{"d", "c"})
	failing := func([]string) ([]store.Run, error) { return nil, errors.New("connection lost") }
	if _, err := q.Runs(time.Hour, whole, failing); err == nil {
		t.Fatal("a failed read of the dirty runs was not reported")
	}
	cancelled := queued("c", at(3), at(7))
	cancelled.Status = api.RunCancelled
	var asked []string
	elsewhere := func(ids []string) ([]store.Run, error) {
		asked = ids
		return []store.Run{cancelled, queued("d", at(4), at(7))}, nil
	}
	got, err = q.Runs(time.Hour, whole, elsewhere)
	if err != nil || len(asked) != 2 || asked[0] != "c" || asked[1] != "d" {
		t.Fatalf("dirty runs read as %v (sorted, both): %v", asked, err)
	}
	sameIDs(t, "after other replicas' writes", got, "d", "b")

	// A write committed while the store is being read is applied after
	// the read, which may have seen the run before it.
	q.Invalidate()
	stale := func() ([]store.Run, error) {
		reads++
		q.Note(map[string]store.Run{"b": placedAt("b", at(2), at(9))})
		return []store.Run{queued("d", at(4), at(7)), queued("b", at(2), at(6))}, nil
	}
	got, _ = q.Runs(time.Hour, stale, byID)
	sameIDs(t, "rebuilt while b was placed", got, "d")

	// Past the resync period the copy is read whole again.
	before := reads
	stored = []store.Run{queued("e", at(8), at(8))}
	got, _ = q.Runs(0, whole, byID)
	if reads != before+1 {
		t.Fatal("no rebuild past the resync period")
	}
	sameIDs(t, "resynced", got, "e")
}

func placedAt(id string, created, updated time.Time) store.Run {
	r := queued(id, created, updated)
	r.Status = api.RunPlaced
	return r
}
