package storetest

import (
	"context"
	"errors"
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
}
