package nodereport

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// stopped is an Applier whose Issue records the stops it is asked for.
func stopped(stops *[]nodeproto.Command) Applier {
	return Applier{Now: func() time.Time { return t0 }, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Issue: func(_ store.Tx, nodeID string, cmd nodeproto.Command) error {
			*stops = append(*stops, cmd)
			return nil
		}}
}

// TestStraysOfAReturningNodeAreStoppedOnce: a replaced attempt still
// running on a node that comes back is found (HasStrays), stopped with its
// run's grace period and "replaced" (SweepStrays), and not stopped again.
func TestStraysOfAReturningNodeAreStoppedOnce(t *testing.T) {
	run := store.Run{Run: api.Run{ID: "r", Status: api.RunRunning, CreatedAt: t0, UpdatedAt: t0,
		RunSpec: api.RunSpec{Image: "reg/app:1", CPU: 1, MemoryBytes: 1 << 30, GraceSeconds: 30},
		Attempts: []api.Attempt{
			{Number: 1, NodeID: "back", Status: api.AttemptRunning, Replaced: true},
			{Number: 2, NodeID: "other", Status: api.AttemptRunning},
		}}}
	st := memstore.New()
	ctx := context.Background()
	if err := st.Update(ctx, func(tx store.Tx) error { return tx.CreateRun(run) }); err != nil {
		t.Fatal(err)
	}
	var stops []nodeproto.Command
	ap := stopped(&stops)
	for range 2 {
		if err := st.Update(ctx, func(tx store.Tx) error {
			if has, err := HasStrays(tx, "back"); err != nil || !has {
				return err
			}
			return ap.SweepStrays(tx, "back")
		}); err != nil {
			t.Fatal(err)
		}
	}
	if len(stops) != 1 {
		t.Fatalf("%d stops, want 1: %+v", len(stops), stops)
	}
	s := stops[0].StopWorkload
	if stops[0].Kind != nodeproto.KindStopWorkload || s.RunID != "r" || s.Attempt != 1 || s.Reason != "replaced" || s.GracePeriod != 30*time.Second {
		t.Fatalf("stop = %+v, want attempt 1 of r, replaced, 30s grace", s)
	}
	if err := st.View(ctx, func(tx store.Tx) error {
		if has, err := HasStrays(tx, "other"); err != nil || has {
			t.Errorf("the current attempt's node has strays (%v, %v)", has, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestEndedStatusAndGrace: a status is reported only as a run becomes
// terminal, and a run without a grace period gets ten seconds.
func TestEndedStatusAndGrace(t *testing.T) {
	if EndedStatus(api.RunRunning, api.RunSucceeded) != api.RunSucceeded || EndedStatus(api.RunSucceeded, api.RunSucceeded) != "" || EndedStatus(api.RunQueued, api.RunRunning) != "" {
		t.Fatal("EndedStatus should name only a status just become terminal")
	}
	if GraceOf(store.Run{}) != 10*time.Second {
		t.Fatalf("GraceOf without a grace period = %v, want 10s", GraceOf(store.Run{}))
	}
}
