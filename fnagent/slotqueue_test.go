package fnagent

import (
	"errors"
	"sync"
	"testing"
	"time"
)

func TestSlotQueueServesIdleLIFO(t *testing.T) {
	q := newSlotQueue[string](0, nil)
	seedIdle(q, "a", "b", "c")
	for _, want := range []string{"c", "b"} {
		got, w, err := q.acquire(false)
		if err != nil || w != nil || got != want {
			t.Fatalf("acquire = %q, %v, %v; want %q from the top of the stack", got, w, err, want)
		}
	}
	q.put("b")
	got, _ := mustAcquire(t, q, false)
	if got != "b" {
		t.Fatalf("after put(b), acquire = %q; want the most recently used b", got)
	}
	if idle := q.idleSlots(); len(idle) != 1 || idle[0].slot != "a" {
		t.Fatalf("idle = %v; want only a, the least recently used, left to age out", idle)
	}
}

// mustAcquire acquires from q, failing the test on an error.
func mustAcquire[S comparable](t *testing.T, q *slotQueue[S], noWait bool) (S, *slotWaiter[S]) {
	t.Helper()
	slot, w, err := q.acquire(noWait)
	if err != nil {
		t.Fatalf("acquire(%v): %v", noWait, err)
	}
	return slot, w
}

// seedIdle puts slots on the idle stack the way launches with nobody
// waiting do.
func seedIdle[S comparable](q *slotQueue[S], slots ...S) {
	for _, s := range slots {
		q.mu.Lock()
		q.starting++
		q.mu.Unlock()
		q.launched(s, nil)
	}
}

func TestSlotQueueWaitersFIFOAndLaunchOnlyWhenNeeded(t *testing.T) {
	q := newSlotQueue[string](0, nil)
	if q.claimLaunch() {
		t.Fatal("claimLaunch with nobody waiting")
	}
	_, w1 := mustAcquire(t, q, false)
	_, w2 := mustAcquire(t, q, false)
	if !q.claimLaunch() || !q.claimLaunch() {
		t.Fatal("two waiters and no launch in flight: want two launches")
	}
	if q.claimLaunch() {
		t.Fatal("a third launch for two waiters")
	}
	// The first launch lands: it goes to the longest waiter.
	q.launched("x", nil)
	if g := <-w1.ch; g.slot != "x" {
		t.Fatalf("w1 got %+v; want x", g)
	}
	// A busy slot comes back before the second launch lands: w2 takes it,
	// and the launch, when it lands, goes idle.
	q.put("x")
	if g := <-w2.ch; g.slot != "x" {
		t.Fatalf("w2 got %+v; want x", g)
	}
	if idle, _ := q.launched("y", nil); !idle {
		t.Fatal("a launch with nobody waiting should go idle")
	}
	if s := q.stats(); s != (queueStats{Idle: 1, Busy: 1}) {
		t.Fatalf("stats = %+v; want one idle, one busy", s)
	}
}

func TestSlotQueueMaxConcurrency(t *testing.T) {
	q := newSlotQueue[string](1, nil)
	_, w := mustAcquire(t, q, false)
	if !q.claimLaunch() {
		t.Fatal("want a launch below max")
	}
	_, w2 := mustAcquire(t, q, false)
	if q.claimLaunch() {
		t.Fatal("a second launch at max 1")
	}
	if _, _, err := q.acquire(true); !errors.Is(err, errSlotLimit) {
		t.Fatalf("NoWait at max: err = %v; want errSlotLimit", err)
	}
	q.launched("a", nil)
	<-w.ch
	q.put("a")
	if g := <-w2.ch; g.slot != "a" {
		t.Fatalf("w2 got %+v", g)
	}
}

func TestSlotQueueTargetedLaunch(t *testing.T) {
	q := newSlotQueue[string](0, nil)
	_, old := mustAcquire(t, q, false) // waits with no launch (say capacity was short)
	_, mine, err := q.acquire(true)
	if err != nil || mine == nil || !mine.targeted {
		t.Fatalf("NoWait acquire = %v, %v", mine, err)
	}
	// The NoWait call's own launch lands: it goes to that call, not to the
	// older waiter.
	q.launched("n", mine)
	if g := <-mine.ch; g.slot != "n" {
		t.Fatalf("NoWait waiter got %+v", g)
	}
	select {
	case g := <-old.ch:
		t.Fatalf("older waiter got %+v", g)
	default:
	}
	// A targeted launch whose caller left goes to whoever waits.
	_, gone := mustAcquire(t, q, true)
	q.cancel(gone)
	q.launched("m", gone)
	if g := <-old.ch; g.slot != "m" {
		t.Fatalf("older waiter got %+v; want m", g)
	}
}

func TestSlotQueueLaunchFailure(t *testing.T) {
	boom := errors.New("boom")
	q := newSlotQueue[string](0, nil)
	_, w1 := mustAcquire(t, q, false)
	_, w2 := mustAcquire(t, q, false)
	q.claimLaunch()
	q.claimLaunch()
	// First failure: two waiters, one launch left: the longest waiter
	// was counting on it and hears why.
	if !q.launchFailed(boom, nil) {
		t.Fatal("failure not delivered")
	}
	if g := <-w1.ch; !errors.Is(g.err, boom) {
		t.Fatalf("w1 got %+v", g)
	}
	// Add a waiter; now two wait and one launch is in flight.
	_, w3 := mustAcquire(t, q, false)
	q.claimLaunch()
	// w2 and w3 wait on two launches; one fails: w2 gets it.
	q.launchFailed(boom, nil)
	if g := <-w2.ch; !errors.Is(g.err, boom) {
		t.Fatalf("w2 got %+v", g)
	}
	// w3 still has a launch in flight; cancel it and let the launch fail:
	// nobody waits, so nobody hears.
	q.cancel(w3)
	if q.launchFailed(boom, nil) {
		t.Fatal("failure delivered with nobody waiting")
	}
	// A targeted failure goes to its target.
	_, t1 := mustAcquire(t, q, true)
	q.launchFailed(boom, t1)
	if g := <-t1.ch; !errors.Is(g.err, boom) {
		t.Fatalf("target got %+v", g)
	}
	if s := q.stats(); s != (queueStats{}) {
		t.Fatalf("stats = %+v; want empty", s)
	}
}

func TestSlotQueueCancelAfterGrantReturnsSlot(t *testing.T) {
	q := newSlotQueue[string](0, nil)
	_, w := mustAcquire(t, q, false)
	q.claimLaunch()
	q.launched("a", nil)
	got, ok := q.cancel(w)
	if !ok || got != "a" {
		t.Fatalf("cancel = %q, %v; want the granted slot back", got, ok)
	}
	if idle, _ := q.put(got); !idle {
		t.Fatal("put back should go idle")
	}
}

func TestSlotQueueIdlePeriods(t *testing.T) {
	now := time.Unix(100, 0)
	q := newSlotQueue[string](0, func() time.Time { return now })
	seedIdle(q, "a")
	seq1 := q.idleSlots()[0].seq
	if !q.isIdle("a", seq1) {
		t.Fatal("a not idle")
	}
	mustAcquire(t, q, false)
	_, seq2 := q.put("a")
	if q.isIdle("a", seq1) || q.removeIdle("a", seq1) {
		t.Fatal("a timer of an earlier idle period must not act")
	}
	if !q.removeIdle("a", seq2) {
		t.Fatal("removeIdle in the current period failed")
	}
	if q.removeIdle("a", 0) {
		t.Fatal("removed twice")
	}
}

// TestSlotQueueConcurrent runs many calls against a small pool, checking
// the counts balance and no call is lost (run with -race).
func TestSlotQueueConcurrent(t *testing.T) {
	q := newSlotQueue[int](4, nil)
	var next int
	var mu sync.Mutex
	var wg, launches sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, w, err := q.acquire(i%3 == 0)
			if errors.Is(err, errSlotLimit) {
				return
			}
			if w != nil {
				if w.targeted {
					launches.Add(1)
					go func() {
						defer launches.Done()
						mu.Lock()
						next++
						n := next
						mu.Unlock()
						q.launched(n, w)
					}()
				} else if q.claimLaunch() {
					launches.Add(1)
					go func() {
						defer launches.Done()
						mu.Lock()
						next++
						n := next
						mu.Unlock()
						q.launched(n, nil)
					}()
				}
				g := <-w.ch
				s = g.slot
			}
			q.put(s)
		}()
	}
	wg.Wait()
	launches.Wait()
	st := q.stats()
	if st.Busy != 0 || st.Waiting != 0 || st.Starting != 0 || st.Idle > 4 || st.Idle < 1 {
		t.Fatalf("stats = %+v", st)
	}
}
