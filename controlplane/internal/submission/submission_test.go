package submission

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

func keyOf(t *testing.T, path, key string, body any) *Key {
	t.Helper()
	r := httptest.NewRequest("POST", path, nil)
	if key != "" {
		r.Header.Set(api.HeaderIdempotencyKey, key)
	}
	k, err := Of(r, body)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestKeyNamesItsRuns: a request without a key is unkeyed; with one, its
// run IDs are the same for every copy and differ with the key, the index
// and the caller's body only in the fingerprint.
func TestKeyNamesItsRuns(t *testing.T) {
	if k := keyOf(t, "/v1/runs", "", api.RunSpec{Image: "a"}); k != nil {
		t.Fatalf("a request without a key gave %+v, want nil", k)
	}
	a := keyOf(t, "/v1/runs/batch", "k1", api.RunBatch{Runs: []api.RunSpec{{Image: "a"}}})
	again := keyOf(t, "/v1/runs/batch", "k1", api.RunBatch{Runs: []api.RunSpec{{Image: "a"}}})
	other := keyOf(t, "/v1/runs/batch", "k2", api.RunBatch{Runs: []api.RunSpec{{Image: "a"}}})
	changed := keyOf(t, "/v1/runs/batch", "k1", api.RunBatch{Runs: []api.RunSpec{{Image: "b"}}})
	if a.ids(2)[0] != again.ids(2)[0] || a.fingerprint != again.fingerprint {
		t.Error("two copies of one keyed request name different runs")
	}
	if ids := a.ids(2); ids[0] == ids[1] || !strings.HasPrefix(ids[0], "r-") || len(ids[0]) != len("r-")+16 {
		t.Errorf("IDs %q: want two distinct run IDs of the usual form", ids)
	}
	if a.ids(1)[0] == other.ids(1)[0] {
		t.Error("two keys name the same run")
	}
	if a.ids(1)[0] != changed.ids(1)[0] || a.fingerprint == changed.fingerprint {
		t.Error("a changed body under one key should name the same runs with another fingerprint (so it is refused)")
	}
}

// TestReplayedRefusesAnotherBody: the runs of a key are found for its
// copy and refused, as a conflict, for another body under it.
func TestReplayedRefusesAnotherBody(t *testing.T) {
	st := memstore.New()
	ctx := context.Background()
	k := keyOf(t, "/v1/runs", "once", api.RunSpec{Image: "a"})
	run := store.Run{Run: api.Run{ID: "r-elsewhere", RunSpec: api.RunSpec{Image: "a"}, PinnedImage: "a@sha256:00", Status: api.RunQueued, Attempts: []api.Attempt{}, CreatedAt: time.Now(), UpdatedAt: time.Now()}}
	if _, ok, err := k.Replayed(ctx, st.View, 1); ok || err != nil {
		t.Fatalf("before any copy: replayed %v, %v; want false, nil", ok, err)
	}
	// A run admitted under an ID not its key's is refused, not renamed
	// (what it sealed under its ID would no longer open).
	if _, _, err := k.Create(ctx, st.Update, st.View, []store.Run{run}); err == nil {
		t.Fatal("Create took a run admitted under another ID")
	}
	run.ID = k.ID(0)
	created, replay, err := k.Create(ctx, st.Update, st.View, []store.Run{run})
	if err != nil || replay {
		t.Fatalf("Create: replay %v, %v", replay, err)
	}
	got, ok, err := k.Replayed(ctx, st.View, 1)
	if err != nil || !ok || got[0].ID != created[0].ID {
		t.Fatalf("the copy: %v %v %v; want the created run", got, ok, err)
	}
	other := keyOf(t, "/v1/runs", "once", api.RunSpec{Image: "b"})
	if _, _, err := other.Replayed(ctx, st.View, 1); !errors.Is(err, failure.ErrConflict) {
		t.Fatalf("another body under the key: %v, want a conflict", err)
	}
	// A racing copy that admitted its run before the first committed.
	if got, replay, err := k.Create(ctx, st.Update, st.View, []store.Run{run}); err != nil || !replay || got[0].ID != created[0].ID {
		t.Fatalf("a racing copy's Create: %v %v %v; want the first's run, as a replay", got, replay, err)
	}
}

// TestValidKey: the header's length and characters are checked.
func TestValidKey(t *testing.T) {
	if err := Valid("0f8c:batch-7_a.b"); err != nil {
		t.Errorf("a valid key refused: %v", err)
	}
	for _, bad := range []string{strings.Repeat("x", api.MaxIdempotencyKey+1), "a b", "a/b", "ü"} {
		if err := Valid(bad); !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("key %q: %v, want ErrInvalid", bad, err)
		}
	}
}
