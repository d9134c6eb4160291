package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// fakeClock is a settable clock shared by the server under test.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type protoFixture struct {
	srv   *Server
	st    store.Store
	clock *fakeClock
	http  *httptest.Server
	tr    *nodeagent.HTTPTransport
}

func newProtoFixture(t *testing.T) *protoFixture {
	clock := &fakeClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	st := memstore.New()
	srv := New(Config{Now: clock.Now, SessionTTL: time.Hour}, st, nil, nil)
	h := httptest.NewServer(srv.Handler())
	t.Cleanup(h.Close)
	return &protoFixture{srv: srv, st: st, clock: clock, http: h, tr: nodeagent.NewHTTPTransport(h.URL, nil)}
}

// invite stores an invitation directly, as the invite handler would.
func (f *protoFixture) invite(t *testing.T, nodeID string) string {
	tok := "mci_" + httpapi.RandomToken()
	err := f.st.Update(context.Background(), func(tx store.Tx) error {
		if _, err := tx.GetNode(nodeID); errors.Is(err, failure.ErrNotFound) {
			if err := tx.PutNode(store.Node{ID: nodeID, CreatedAt: f.clock.Now()}); err != nil {
				return err
			}
		}
		return tx.CreateInvitation(store.Invitation{TokenHash: httpapi.HashToken(tok), NodeID: nodeID, CreatedAt: f.clock.Now(), ExpiresAt: f.clock.Now().Add(time.Hour)})
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (f *protoFixture) enroll(t *testing.T, nodeID, inv string) nodeproto.Enrollment {
	e, err := f.tr.Enroll(context.Background(), nodeproto.EnrollmentRequest{NodeID: nodeID, Invitation: inv, CapabilityVersion: nodeproto.Version})
	if err != nil {
		t.Fatalf("enroll: %v", err)
	}
	return e
}

func TestEnrollmentRaisesFencingAndFencesOldSession(t *testing.T) {
	f := newProtoFixture(t)
	first := f.enroll(t, "n1", f.invite(t, "n1"))
	second := f.enroll(t, "n1", f.invite(t, "n1"))
	if second.FencingToken <= first.FencingToken {
		t.Fatalf("fencing token %d after %d", second.FencingToken, first.FencingToken)
	}
	ctx := context.Background()
	_, err := f.tr.SendEvents(ctx, "n1", first.SessionToken, []nodeproto.Event{{ID: "x-1", Kind: nodeproto.EventFacts, Facts: &nodeproto.NodeFacts{CPUs: 1}}})
	if !errors.Is(err, failure.ErrFenced) {
		t.Fatalf("old session's events: %v, want fenced", err)
	}
	if err := f.tr.Session(ctx, "n1", first.SessionToken, make(chan nodeproto.Command)); !errors.Is(err, failure.ErrFenced) {
		t.Fatalf("old session's stream: %v, want fenced", err)
	}
	if _, err := f.tr.RenewSession(ctx, "n1", first.SessionToken); !errors.Is(err, failure.ErrFenced) {
		t.Fatalf("old session's renewal: %v, want fenced", err)
	}
	if _, err := f.tr.SendEvents(ctx, "n1", second.SessionToken, nil); err != nil {
		t.Fatalf("current session: %v", err)
	}
	// Nothing the fenced session sent was applied.
	if err := f.st.View(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode("n1")
		if err != nil {
			return err
		}
		if n.Facts != nil {
			t.Error("facts from a fenced session were applied")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestInvitationSpentAndExpired(t *testing.T) {
	f := newProtoFixture(t)
	inv := f.invite(t, "n1")
	f.enroll(t, "n1", inv)
	_, err := f.tr.Enroll(context.Background(), nodeproto.EnrollmentRequest{NodeID: "n1", Invitation: inv})
	if !errors.Is(err, failure.ErrUnauthorized) || !strings.Contains(err.Error(), "already used") {
		t.Fatalf("second use: %v", err)
	}
	late := f.invite(t, "n2")
	f.clock.Advance(2 * time.Hour)
	if _, err := f.tr.Enroll(context.Background(), nodeproto.EnrollmentRequest{NodeID: "n2", Invitation: late}); !errors.Is(err, failure.ErrUnauthorized) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired invitation: %v", err)
	}
	if _, err := f.tr.Enroll(context.Background(), nodeproto.EnrollmentRequest{NodeID: "n3", Invitation: inv}); !errors.Is(err, failure.ErrUnauthorized) {
		t.Fatalf("invitation for another node: %v", err)
	}
}

func TestSessionRenewalAndExpiry(t *testing.T) {
	f := newProtoFixture(t)
	e := f.enroll(t, "n1", f.invite(t, "n1"))
	f.clock.Advance(40 * time.Minute)
	r, err := f.tr.RenewSession(context.Background(), "n1", e.SessionToken)
	if err != nil || r.FencingToken != e.FencingToken || !r.ExpiresAt.After(e.ExpiresAt) {
		t.Fatalf("renewal: %v %+v", err, r)
	}
	f.clock.Advance(30 * time.Minute) // the first credential has lapsed, the renewed one has not
	if _, err := f.tr.SendEvents(context.Background(), "n1", e.SessionToken, nil); !errors.Is(err, failure.ErrUnauthorized) || !strings.Contains(err.Error(), "node invite") {
		t.Fatalf("lapsed credential: %v, want unauthorized with the way back", err)
	}
	if _, err := f.tr.SendEvents(context.Background(), "n1", r.SessionToken, nil); err != nil {
		t.Fatalf("renewed credential: %v", err)
	}
}

// TestEventsAppliedOnce: a redelivered event is acknowledged but applied
// once; the counters say so.
func TestEventsAppliedOnce(t *testing.T) {
	f := newProtoFixture(t)
	e := f.enroll(t, "n1", f.invite(t, "n1"))
	ctx := context.Background()
	now := f.clock.Now()
	run := store.Run{Run: api.Run{ID: "r1", Status: api.RunQueued, CreatedAt: now}}
	if err := f.st.Update(ctx, func(tx store.Tx) error { return tx.CreateRun(run) }); err != nil {
		t.Fatal(err)
	}
	// Place it by hand so observations apply.
	if err := f.st.Update(ctx, func(tx store.Tx) error {
		r, err := tx.GetRun("r1")
		if err != nil {
			return err
		}
		r.Attempts = []api.Attempt{{Number: 1, NodeID: "n1", Status: api.AttemptRunning, PlacedAt: now}}
		r.Status = api.RunRunning
		r.Retries = 5
		return tx.PutRun(r)
	}); err != nil {
		t.Fatal(err)
	}
	code := 1
	exited := nodeproto.Event{ID: "inc-0000000000000001", Kind: nodeproto.EventWorkload, Workload: &nodeproto.WorkloadObservation{
		WorkloadKey: nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}, Phase: nodeproto.PhaseExited, ExitCode: &code, StartedAt: &now, FinishedAt: &now}}
	for i := 0; i < 5; i++ {
		acked, err := f.tr.SendEvents(ctx, "n1", e.SessionToken, []nodeproto.Event{exited})
		if err != nil || len(acked) != 1 || acked[0] != exited.ID {
			t.Fatalf("delivery %d: %v %v", i, err, acked)
		}
	}
	var r store.Run
	if err := f.st.View(ctx, func(tx store.Tx) error {
		var err error
		r, err = tx.GetRun("r1")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Applied once: one failed attempt, the run queued for its first retry
	// (five applications would not change this, so count the series too).
	if r.Status != api.RunQueued || len(r.Attempts) != 1 {
		t.Fatalf("run after redeliveries: %s with %d attempts", r.Status, len(r.Attempts))
	}
	if got := counterValue(t, f, `mercator_node_events_total{outcome="applied"}`); got != 1 {
		t.Fatalf("applied = %v, want 1", got)
	}
	if got := counterValue(t, f, `mercator_node_events_total{outcome="duplicate"}`); got != 4 {
		t.Fatalf("duplicate = %v, want 4", got)
	}
}

func counterValue(t *testing.T, f *protoFixture, series string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	f.srv.metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var n float64
			if _, err := fmt.Sscan(v, &n); err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("series %s not exposed", series)
	return 0
}
