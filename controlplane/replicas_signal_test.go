package controlplane

import (
	"testing"
	"time"

	"github.com/mercator/mercator/controlplane/internal/nodeauth"
	"github.com/mercator/mercator/controlplane/internal/signals"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// TestLostSignalWakesEveryWaiter: signals.Lost (a signal was dropped on the
// way, which one is not known) wakes every node's session streams, the run
// long polls and the reconcile loop, so that none waits for its timer.
func TestLostSignalWakesEveryWaiter(t *testing.T) {
	s := New(Config{}, memstore.New(), nil, nil)
	a, b := s.nodeBroadcast("node-a").Wait(), s.nodeBroadcast("node-b").Wait()
	runs := s.runs.Wait()
	s.deliver(signals.BatchPrefix + "node:node-c\n" + signals.Lost)
	for name, ch := range map[string]<-chan struct{}{"node-a's streams": a, "node-b's streams": b, "run long polls": runs} {
		select {
		case <-ch:
		default:
			t.Errorf("%s not woken by signals.Lost", name)
		}
	}
	select {
	case <-s.reconcileWake:
	default: // delivered synchronously, into the loop's one-signal buffer
		t.Error("the reconcile loop not woken by signals.Lost")
	}
}

// TestLostSignalDropsWhatItCouldHaveChanged: after signals.Lost the cached
// fencing tokens and sessions are gone (a lost "fence:" signal), and the
// copies of the active and queued runs are rebuilt at their next read (a
// lost "runs:" signal), however recently they were built.
func TestLostSignalDropsWhatItCouldHaveChanged(t *testing.T) {
	s := New(Config{}, memstore.New(), nil, nil)
	now := s.now()
	_, _, gen := s.auth.Fence("node-a", now)
	s.auth.PutFence("node-a", nodeauth.Fence{Token: 3}, gen, now)
	s.auth.PutSession("hash-a", store.Session{NodeID: "node-a", FencingToken: 3})
	reads := 0
	active := func() ([]store.Run, error) { reads++; return nil, nil }
	none := func([]string) ([]store.Run, error) { return nil, nil }
	queued := func() ([]store.Run, error) { reads++; return nil, nil }
	if err := s.sched.Refresh(time.Hour, active, none); err != nil {
		t.Fatal(err)
	}
	if _, err := s.queued.Runs(time.Hour, queued, none); err != nil {
		t.Fatal(err)
	}
	s.deliver(signals.Lost)
	if _, fresh, _ := s.auth.Fence("node-a", now); fresh {
		t.Error("a cached fencing token survived signals.Lost")
	}
	if _, ok := s.auth.Session("hash-a"); ok {
		t.Error("a cached session survived signals.Lost")
	}
	if err := s.sched.Refresh(time.Hour, active, none); err != nil {
		t.Fatal(err)
	}
	if _, err := s.queued.Runs(time.Hour, queued, none); err != nil {
		t.Fatal(err)
	}
	if reads != 4 {
		t.Errorf("%d whole reads of the copies, want 4: each rebuilt after signals.Lost", reads)
	}
}
