package function

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/callkind"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// testClock is a clock the test moves; dispatchers read it as their Now.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// durableFixture is a store holding one function (timeout 1 s) with one
// durable call queued, and two replicas' dispatchers over it that share a
// clock. Nothing here runs the dispatch loop or reaches a node: the test
// drives claim and record as the loop would, so a crash is simply a claim
// never followed by its record.
type durableFixture struct {
	st     store.Store
	clock  *testClock
	a, b   *Service
	callID string
	lease  time.Duration // from a claim to the moment it lapses
}

func newDurableFixture(t *testing.T) *durableFixture {
	t.Helper()
	clock := &testClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	st := memstore.New()
	fn := store.Fn{Fn: api.Fn{ID: "fn1", AppID: "app1", Name: "f", Image: "registry.example/f@sha256:" + strings.Repeat("ab", 32), Timeout: 1}}
	call := store.Call{FnCall: api.FnCall{ID: "call1", Status: api.CallQueued, AppID: "app1", FnID: "fn1", CreatedAt: clock.Now()}, Due: clock.Now()}
	if err := st.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.CreateApp(store.App{App: api.App{ID: "app1", Name: "app"}}); err != nil {
			return err
		}
		if err := tx.CreateFn(fn); err != nil {
			return err
		}
		return tx.CreateCall(call)
	}); err != nil {
		t.Fatal(err)
	}
	dispatcher := func() *Service {
		return New(Config{Store: st, Now: clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, nil, nil)
	}
	return &durableFixture{st: st, clock: clock, a: dispatcher(), b: dispatcher(), callID: call.ID,
		lease: time.Second + AnswerGrace + asyncLeaseGrace}
}

func (f *durableFixture) claim(t *testing.T, s *Service) []store.Call {
	t.Helper()
	claimed, err := s.claim(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	return claimed
}

func (f *durableFixture) call(t *testing.T) store.Call {
	t.Helper()
	var c store.Call
	if err := f.st.View(context.Background(), func(tx store.Tx) error {
		var err error
		c, err = tx.GetCall(f.callID)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDurableClaimLapsesAfterACrash: a dispatcher that dies holding a
// claim keeps every other dispatcher off the call until the claim's lease
// (the function's timeout, AnswerGrace and asyncLeaseGrace) lapses, and no
// longer; the call is then delivered again, as its second attempt, and the
// dead dispatcher's claim can no longer record an outcome.
func TestDurableClaimLapsesAfterACrash(t *testing.T) {
	f := newDurableFixture(t)
	start := f.clock.Now()
	first := f.claim(t, f.a)
	if len(first) != 1 || first[0].Attempts != 1 || first[0].Status != api.CallRunning {
		t.Fatalf("first claim = %+v, want the call, running, attempt 1", first)
	}
	// Dispatcher a crashes here: it never records an outcome.
	if got := f.claim(t, f.b); len(got) != 0 {
		t.Fatalf("another dispatcher claimed a held call: %+v", got)
	}
	f.clock.Set(start.Add(f.lease - time.Nanosecond))
	if got := f.claim(t, f.b); len(got) != 0 {
		t.Fatalf("claimed before the lease lapsed: %+v", got)
	}
	f.clock.Set(start.Add(f.lease))
	second := f.claim(t, f.b)
	if len(second) != 1 || second[0].Attempts != 2 || second[0].Claim == first[0].Claim {
		t.Fatalf("after the lease lapsed, claim = %+v, want the call again as attempt 2 under a new claim", second)
	}
	// The crashed dispatcher's outcome, arriving late, is not recorded.
	f.a.record(first[0], callOutcome{}, &bufferSink{status: 200})
	if c := f.call(t); c.Status != api.CallRunning || c.Claim != second[0].Claim {
		t.Fatalf("a stale claim recorded an outcome: %+v", c.FnCall)
	}
	f.b.record(second[0], callOutcome{}, &bufferSink{status: 200})
	if c := f.call(t); c.Status != api.CallSuccess || c.Attempts != 2 {
		t.Fatalf("after the current claim's outcome: %+v, want success after 2 attempts", c.FnCall)
	}
}

// TestDurableDeliveryCap: a call whose deliveries keep failing for reasons
// that are not the function's (its node lost) is delivered again with a
// backoff, asyncMaxAttempts times in all, and then ends in error saying
// so; a crash on the last delivery ends it too, once the claim lapses.
func TestDurableDeliveryCap(t *testing.T) {
	for _, crashLast := range []bool{false, true} {
		f := newDurableFixture(t)
		deliveries := 0
		for i := 0; i < 3*asyncMaxAttempts && f.call(t).Status != api.CallError; i++ {
			claimed := f.claim(t, f.a)
			if len(claimed) == 1 {
				deliveries++
				if !(crashLast && deliveries == asyncMaxAttempts) {
					f.a.record(claimed[0], callOutcome{kind: callkind.NodeLost, message: "node lost"}, nil)
					// The last delivery's failure ends the call then, not at
					// a later claim.
					if done := f.call(t).Status == api.CallError; done != (deliveries == asyncMaxAttempts) {
						t.Fatalf("after delivery %d the call is %s", deliveries, f.call(t).Status)
					}
				}
			}
			// Past any backoff (30 s at most) and any claim's lease.
			f.clock.Set(f.clock.Now().Add(f.lease + 30*time.Second))
		}
		c := f.call(t)
		if deliveries != asyncMaxAttempts || c.Status != api.CallError || c.Attempts != asyncMaxAttempts || c.CompletedAt == nil {
			t.Fatalf("crash on the last: %v: %d deliveries, call %+v; want %d deliveries and then an error", crashLast, deliveries, c.FnCall, asyncMaxAttempts)
		}
		if !crashLast && c.ErrorKind != callkind.NodeLost {
			t.Errorf("error kind %q, want the last delivery's %q", c.ErrorKind, callkind.NodeLost)
		}
	}
}
