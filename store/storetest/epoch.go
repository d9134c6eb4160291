package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// testEpochs: each Lead starts a later epoch; a transaction checking an
// earlier one is refused as fenced and keeps nothing it wrote, in both kinds
// of write transaction; the current one passes.
func testEpochs(t *testing.T, s store.Store) {
	ctx := context.Background()
	first, err := s.Lead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Lead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if second <= first {
		t.Fatalf("Lead gave %d after %d, want a later epoch", second, first)
	}
	for name, update := range map[string]func(context.Context, func(store.Tx) error) error{"Update": s.Update, "UpdateLocked": s.UpdateLocked} {
		err := update(ctx, func(tx store.Tx) error {
			if err := tx.PutNode(store.Node{ID: "stale-" + name}); err != nil {
				return err
			}
			return tx.CheckEpoch(first)
		})
		if !errors.Is(err, failure.ErrFenced) {
			t.Errorf("%s checking the superseded epoch = %v, want ErrFenced", name, err)
		}
		if err := update(ctx, func(tx store.Tx) error { return tx.CheckEpoch(second) }); err != nil {
			t.Errorf("%s checking the current epoch = %v", name, err)
		}
	}
	err = s.View(ctx, func(tx store.Tx) error {
		for _, id := range []string{"stale-Update", "stale-UpdateLocked"} {
			if _, err := tx.GetNode(id); !errors.Is(err, failure.ErrNotFound) {
				t.Errorf("a fenced transaction kept its write of node %s (%v)", id, err)
			}
		}
		return tx.CheckEpoch(second)
	})
	if err != nil {
		t.Errorf("View checking the current epoch = %v", err)
	}
}

// testNodesSeen: NodesSeen moves each stored node's LastSeenAt forward,
// never back, returns what each had before, skips unknown nodes, and what
// it wrote is what GetNode, ListNodes and a later PutNode see.
func testNodesSeen(t *testing.T, s store.Store) {
	a, b := sampleNode("node-a"), sampleNode("node-b")
	b.LastSeenAt = nil
	update(t, s, func(tx store.Tx) error {
		must(t, tx.PutNode(a))
		return tx.PutNode(b)
	})
	was := *a.LastSeenAt
	later, earlier := was.Add(time.Minute), was.Add(-time.Minute)
	update(t, s, func(tx store.Tx) error {
		before, err := tx.NodesSeen(map[string]time.Time{"node-a": later, "node-b": earlier, "nobody": later})
		must(t, err)
		if len(before) != 2 || !before["node-a"].Equal(was) || !before["node-b"].IsZero() {
			t.Errorf("NodesSeen's before = %v, want node-a at %s and node-b at zero, nobody skipped", before, was)
		}
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		before, err := tx.NodesSeen(map[string]time.Time{"node-a": was})
		must(t, err)
		if !before["node-a"].Equal(later) {
			t.Errorf("before = %v, want node-a at %s", before, later)
		}
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		n := must1[store.Node](t)(tx.GetNode("node-a"))
		if n.LastSeenAt == nil || !n.LastSeenAt.Equal(later) {
			t.Errorf("node-a last seen %v after a later and then an earlier report, want %s (never back)", n.LastSeenAt, later)
		}
		if n.Facts == nil || n.Facts.Hostname != a.Facts.Hostname {
			t.Errorf("NodesSeen changed the rest of the record: %+v", n)
		}
		for _, n := range must1[[]store.Node](t)(tx.ListNodes()) {
			if n.ID == "node-b" && (n.LastSeenAt == nil || !n.LastSeenAt.Equal(earlier)) {
				t.Errorf("ListNodes: node-b last seen %v, want %s", n.LastSeenAt, earlier)
			}
		}
		return nil
	})
	// A record written back carries the moment it was read with.
	update(t, s, func(tx store.Tx) error {
		n := must1[store.Node](t)(tx.GetNode("node-a"))
		n.FencingToken++
		return tx.PutNode(n)
	})
	view(t, s, func(tx store.Tx) error {
		if n := must1[store.Node](t)(tx.GetNode("node-a")); n.LastSeenAt == nil || !n.LastSeenAt.Equal(later) {
			t.Errorf("node-a written back: last seen %v, want %s", n.LastSeenAt, later)
		}
		return nil
	})
	// A record written back from an older read, or with no moment at all,
	// keeps the moment NodesSeen recorded; a later one moves it.
	for _, put := range []*time.Time{&earlier, nil} {
		update(t, s, func(tx store.Tx) error {
			n := must1[store.Node](t)(tx.GetNode("node-a"))
			n.LastSeenAt = put
			return tx.PutNode(n)
		})
		view(t, s, func(tx store.Tx) error {
			if n := must1[store.Node](t)(tx.GetNode("node-a")); n.LastSeenAt == nil || !n.LastSeenAt.Equal(later) {
				t.Errorf("node-a written back with last seen %v: read %v, want %s (never back)", put, n.LastSeenAt, later)
			}
			return nil
		})
	}
	latest := later.Add(time.Minute)
	update(t, s, func(tx store.Tx) error {
		n := must1[store.Node](t)(tx.GetNode("node-a"))
		n.LastSeenAt = &latest
		return tx.PutNode(n)
	})
	// One batch of nodes heard before and a node heard for the first
	// time: each answers with its own before, each moves.
	c := sampleNode("node-c")
	update(t, s, func(tx store.Tx) error { return tx.PutNode(c) })
	update(t, s, func(tx store.Tx) error {
		before, err := tx.NodesSeen(map[string]time.Time{"node-a": latest.Add(time.Minute), "node-b": latest, "node-c": latest})
		must(t, err)
		want := map[string]time.Time{"node-a": latest, "node-b": earlier, "node-c": *c.LastSeenAt}
		for id, at := range want {
			if got, ok := before[id]; !ok || !got.Equal(at) {
				t.Errorf("NodesSeen's before for %s = %v (%v), want %s", id, got, ok, at)
			}
		}
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		want := map[string]time.Time{"node-a": latest.Add(time.Minute), "node-b": latest, "node-c": latest}
		for _, n := range must1[[]store.Node](t)(tx.GetNodes([]string{"node-a", "node-b", "node-c"})) {
			if n.LastSeenAt == nil || !n.LastSeenAt.Equal(want[n.ID]) {
				t.Errorf("GetNodes: %s last seen %v, want %s", n.ID, n.LastSeenAt, want[n.ID])
			}
		}
		return nil
	})
}

// testNodeVersions: NodeVersions lists every node in ID order with its
// last-seen moment; a node's Rev changes with every PutNode (even of the
// same record) and with nothing else, NodesSeen included; and a version
// read in one transaction matches the record GetNodes reads in it.
func testNodeVersions(t *testing.T, s store.Store) {
	versions := func() map[string]store.NodeVersion {
		t.Helper()
		out := map[string]store.NodeVersion{}
		view(t, s, func(tx store.Tx) error {
			vs := must1[[]store.NodeVersion](t)(tx.NodeVersions())
			var ids []string
			for _, v := range vs {
				ids = append(ids, v.ID)
				out[v.ID] = v
			}
			if !slices.IsSorted(ids) || len(out) != len(vs) {
				t.Errorf("NodeVersions IDs %v: want each once, in order", ids)
			}
			return nil
		})
		return out
	}
	if vs := versions(); len(vs) != 0 {
		t.Fatalf("NodeVersions of an empty store = %v", vs)
	}
	a, b := sampleNode("node-a"), sampleNode("node-b")
	b.LastSeenAt = nil
	update(t, s, func(tx store.Tx) error {
		must(t, tx.PutNode(b))
		return tx.PutNode(a)
	})
	first := versions()
	if len(first) != 2 || first["node-a"].LastSeenAt == nil || !first["node-a"].LastSeenAt.Equal(*a.LastSeenAt) || first["node-b"].LastSeenAt != nil {
		t.Fatalf("NodeVersions = %+v, want node-a seen at %s and node-b never", first, a.LastSeenAt)
	}
	// Heard from: the moment moves, the version stays.
	later := a.LastSeenAt.Add(time.Minute)
	update(t, s, func(tx store.Tx) error {
		_, err := tx.NodesSeen(map[string]time.Time{"node-a": later, "node-b": later})
		return err
	})
	seen := versions()
	for _, id := range []string{"node-a", "node-b"} {
		if seen[id].Rev != first[id].Rev {
			t.Errorf("%s: Rev %d after NodesSeen, was %d: only PutNode changes it", id, seen[id].Rev, first[id].Rev)
		}
		if seen[id].LastSeenAt == nil || !seen[id].LastSeenAt.Equal(later) {
			t.Errorf("%s: last seen %v after NodesSeen, want %s", id, seen[id].LastSeenAt, later)
		}
	}
	// Written: that node's version changes, even for the same record; the
	// other's stays. A transaction that fails changes nothing.
	update(t, s, func(tx store.Tx) error {
		n := must1[store.Node](t)(tx.GetNode("node-b"))
		return tx.PutNode(n)
	})
	failed := errors.New("rolled back")
	if err := s.Update(context.Background(), func(tx store.Tx) error {
		n := must1[store.Node](t)(tx.GetNode("node-a"))
		n.Cordoned = true
		must(t, tx.PutNode(n))
		return failed
	}); !errors.Is(err, failed) {
		t.Fatalf("Update = %v, want %v", err, failed)
	}
	put := versions()
	if put["node-b"].Rev == seen["node-b"].Rev {
		t.Errorf("node-b: Rev %d unchanged by a PutNode", put["node-b"].Rev)
	}
	if put["node-a"].Rev != seen["node-a"].Rev {
		t.Errorf("node-a: Rev %d → %d by a transaction that was rolled back", seen["node-a"].Rev, put["node-a"].Rev)
	}
	update(t, s, func(tx store.Tx) error {
		n := must1[store.Node](t)(tx.GetNode("node-b"))
		n.Cordoned = true
		return tx.PutNode(n)
	})
	again := versions()
	if r := again["node-b"].Rev; r == put["node-b"].Rev || r == seen["node-b"].Rev {
		t.Errorf("node-b: Rev %d after a second PutNode, seen before as %d and %d", r, seen["node-b"].Rev, put["node-b"].Rev)
	}
	view(t, s, func(tx store.Tx) error {
		got := must1[[]store.Node](t)(tx.GetNodes([]string{"node-b"}))
		if len(got) != 1 || !got[0].Cordoned {
			t.Errorf("GetNodes(node-b) = %+v, want the cordoned record", got)
		}
		return nil
	})
}
