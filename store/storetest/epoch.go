package storetest

import (
	"context"
	"errors"
	"testing"

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
