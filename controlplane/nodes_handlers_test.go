package controlplane

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// slowStore is a store whose reads of runs take as long as advance makes
// the clock move: what every active run's read costs on a large fleet
// under load.
type slowStore struct {
	store.Store
	advance func()
}

func (s slowStore) View(ctx context.Context, fn func(store.Tx) error) error {
	return s.Store.View(ctx, func(tx store.Tx) error { return fn(slowTx{tx, s.advance}) })
}

type slowTx struct {
	store.Tx
	advance func()
}

func (t slowTx) ListRuns(opts store.ListRunsOptions) ([]store.Run, error) {
	t.advance()
	return t.Tx.ListRuns(opts)
}

// TestNodeStatusJudgedAtTheRead: a node heard from within its lease, as
// the records read show, is ready in GET /v1/nodes (whole and paged) and
// GET /v1/nodes/{id}, however long the reads took. Judged by the clock
// after a long read, the records' moments looked a lease old: at the end
// of a 100,000-run hold on PostgreSQL, the listing showed the other
// replica's 5,000 nodes unreachable while every one of them heartbeated.
func TestNodeStatusJudgedAtTheRead(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	st := memstore.New()
	heard := now.Add(-20 * time.Second) // within the 30s lease
	if err := st.Update(t.Context(), func(tx store.Tx) error {
		return tx.PutNode(store.Node{ID: "n1", CreatedAt: heard, EnrolledAt: &heard, LastSeenAt: &heard})
	}); err != nil {
		t.Fatal(err)
	}
	srv := New(Config{Now: func() time.Time { return now }}, slowStore{st, func() { now = now.Add(20 * time.Second) }}, nil, nil)
	for _, path := range []string{"/v1/nodes", "/v1/nodes?limit=10"} {
		start := now
		w := httptest.NewRecorder()
		srv.listNodes(w, httptest.NewRequest("GET", path, nil))
		var list api.NodeList
		if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil || len(list.Nodes) != 1 {
			t.Fatalf("GET %s: %d %s", path, w.Code, w.Body)
		}
		if got := list.Nodes[0].Status; got != api.NodeReady || !now.After(start) {
			t.Errorf("GET %s: n1 %s (the clock moved %v during the reads), want ready", path, got, now.Sub(start))
		}
		now = start
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/v1/nodes/n1", nil)
	r.SetPathValue("id", "n1")
	srv.getNode(w, r)
	var n api.Node
	if err := json.Unmarshal(w.Body.Bytes(), &n); err != nil || n.Status != api.NodeReady {
		t.Errorf("GET /v1/nodes/n1: %d %s, want ready", w.Code, w.Body)
	}
}
