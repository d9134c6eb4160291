package controlplane

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

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

// leadingCoordinator is a Coordinator for one replica that leads: what it
// publishes goes to published, and it hears nothing from others.
type leadingCoordinator struct{ published chan string }

func (c leadingCoordinator) Publish(_ context.Context, payload string) error {
	c.published <- payload
	return nil
}
func (leadingCoordinator) Subscribe(context.Context) <-chan string { return nil }
func (leadingCoordinator) Leader() bool                            { return true }
func (leadingCoordinator) Term() uint64                            { return 1 }

// TestTakingTheLeadWakesEverySession: a replica that starts a scheduling
// epoch wakes the session streams it holds and asks every other replica
// to wake theirs (topicSessions), so a launch that the replica leading
// before committed without its signal leaving is read at once, not at a
// stream's poll minutes later. The other replica, hearing it, wakes its
// streams and nothing else.
func TestTakingTheLeadWakesEverySession(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	coord := leadingCoordinator{published: make(chan string, 16)}
	st := memstore.New()
	s := New(Config{Lease: time.Minute}, st, nil, coord)
	a, b := s.nodeBroadcast("node-a").Wait(), s.nodeBroadcast("node-b").Wait()
	if !s.startEpoch(ctx) {
		t.Fatal("could not start an epoch")
	}
	for name, ch := range map[string]<-chan struct{}{"node-a": a, "node-b": b} {
		select {
		case <-ch:
		default:
			t.Errorf("%s's session stream not woken when its replica took the lead", name)
		}
	}
	go s.publishLoop(ctx)
	var payload string
	select {
	case payload = <-coord.published:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing published to the other replicas after taking the lead")
	}
	if !slices.Contains(signals.Split(payload), topicSessions) {
		t.Fatalf("published %q after taking the lead, want %q among it", payload, topicSessions)
	}

	other := New(Config{Lease: time.Minute}, st, nil, nil)
	now := other.now()
	_, _, gen := other.auth.Fence("node-c", now)
	other.auth.PutFence("node-c", nodeauth.Fence{Token: 3}, gen, now)
	c := other.nodeBroadcast("node-c").Wait()
	runs := other.runs.Wait()
	other.deliver(payload)
	select {
	case <-c:
	default:
		t.Error("the other replica's session stream not woken by the new leader's signal")
	}
	select {
	case <-runs:
		t.Error("the new leader's signal woke the other replica's run long polls: only sessions need to look")
	default:
	}
	if _, fresh, _ := other.auth.Fence("node-c", now); !fresh {
		t.Error("the new leader's signal dropped the other replica's cached fencing tokens: only signals.Lost may")
	}
}

// TestEpochTimestamps: the epoch's start and its first placement are
// stamped by the replica's clock as they happen (what a takeover is
// measured by: a scrape can come late), a later placement moves neither,
// and a replica that stops leading shows neither.
func TestEpochTimestamps(t *testing.T) {
	clock := time.Unix(1_800_000_000, 0)
	s := New(Config{Lease: time.Minute, Now: func() time.Time { return clock }}, memstore.New(), nil, leadingCoordinator{published: make(chan string, 16)})
	started, placed := s.metrics.EpochStarted, s.metrics.EpochFirstPlaced
	if !s.startEpoch(context.Background()) {
		t.Fatal("could not start an epoch")
	}
	if got := gaugeValue(t, started); got != 1_800_000_000 {
		t.Errorf("epoch start %v, want the clock's 1800000000", got)
	}
	clock = clock.Add(1500 * time.Millisecond)
	s.notePlaced(0)
	if got := gaugeValue(t, placed); got != 0 {
		t.Errorf("first placement %v after a chunk that placed nothing, want 0", got)
	}
	s.notePlaced(3)
	clock = clock.Add(time.Second)
	s.notePlaced(2)
	if got := gaugeValue(t, placed); got != 1_800_000_001.5 {
		t.Errorf("first placement %v, want 1800000001.5 (the first chunk that placed, not the later one)", got)
	}
	s.endEpoch()
	if a, b := gaugeValue(t, started), gaugeValue(t, placed); a != 0 || b != 0 {
		t.Errorf("after leading ended: epoch start %v, first placement %v; want 0 and 0", a, b)
	}
	if !s.startEpoch(context.Background()) {
		t.Fatal("could not start a second epoch")
	}
	if got := gaugeValue(t, placed); got != 0 {
		t.Errorf("a new epoch shows the previous one's first placement %v, want 0", got)
	}
}

// gaugeValue is g's value.
func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}
