package fnagent

import (
	"errors"
	"slices"
	"sync"
	"time"
)

// slotQueue is the bookkeeping of one pool of hot containers (Fn's
// slotQueue): which containers are idle, which calls wait for one, and how
// many launches are in flight. It does no I/O and starts nothing; the engine
// asks it what to do and does it, so the rules below are tested with plain
// values standing in for containers.
//
// The rules:
//
//   - Idle slots are a stack: take returns the most recently used, so under
//     a falling load the same few containers stay warm and the rest age out
//     of the bottom of the stack.
//   - Waiters are a queue: a slot that is put back, or a launch that
//     completes, goes to the waiter that has waited longest.
//   - A launch is needed only while more calls wait than launches are in
//     flight (claimLaunch), and never past max slots in all
//     (idle+busy+starting).
//   - At a target concurrency above 1 (target.go) a launch is needed only
//     when the calls busy and waiting exceed target per container, and a
//     NoWait call waits for a busy container while they do not.
//   - A NoWait call that must launch claims a launch targeted at itself, so
//     the container it pays for is not handed to an older waiter while it
//     waits with nothing in flight for it.
//
// All methods are safe for concurrent use.
type slotQueue[S comparable] struct {
	mu       sync.Mutex
	max      int // 0: no limit
	target   int // calls per container the pool aims at (target.go); 1 unless set
	now      func() time.Time
	idle     []idleSlot[S] // the top of the stack is the end
	waiters  []*slotWaiter[S]
	starting int
	busy     int
	seq      uint64
}

// idleSlot is one idle slot. seq identifies this period of idleness, so a
// timer set when it went idle acts only if it is still the same period.
type idleSlot[S comparable] struct {
	slot  S
	seq   uint64
	since time.Time
}

// slotWaiter is one waiting call. It receives exactly one grant on ch,
// unless it is canceled first.
type slotWaiter[S comparable] struct {
	ch       chan slotGrant[S]
	targeted bool // a launch was claimed for this waiter alone
	done     bool // granted or canceled; guarded by slotQueue.mu
}

// slotGrant is a slot, or the error of the launch that was meant for the
// waiter.
type slotGrant[S comparable] struct {
	slot S
	err  error
}

// errSlotLimit is take's answer for NoWait when the pool is at max.
var errSlotLimit = errors.New("at max concurrency")

func newSlotQueue[S comparable](max int, now func() time.Time) *slotQueue[S] {
	if now == nil {
		now = time.Now
	}
	return &slotQueue[S]{max: max, now: now, target: 1}
}

// withTarget sets the pool's target concurrency (target.go); below 1 is 1.
func (q *slotQueue[S]) withTarget(target int) *slotQueue[S] {
	q.target = max(target, 1)
	return q
}

func (q *slotQueue[S]) total() int { return len(q.idle) + q.busy + q.starting }

func (q *slotQueue[S]) belowMax() bool { return q.max <= 0 || q.total() < q.max }

// acquire pops the most recently used idle slot (ok). Otherwise it enqueues
// a waiter. For noWait it also claims a launch targeted at that waiter
// (w.targeted), unless the pool's target concurrency has the call wait for
// a busy container (waitForBusy), and fails with errSlotLimit instead of
// enqueueing when the pool is at max; the caller of a targeted waiter must
// then reserve resources and launch, or call unclaim and cancel.
func (q *slotQueue[S]) acquire(noWait bool) (slot S, w *slotWaiter[S], err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := len(q.idle); n > 0 {
		slot = q.idle[n-1].slot
		q.idle = q.idle[:n-1]
		q.busy++
		return slot, nil, nil
	}
	launch := noWait && !waitForBusy(len(q.waiters), q.busy, q.total(), q.target)
	if launch {
		if !q.belowMax() {
			return slot, nil, errSlotLimit
		}
		q.starting++
	}
	w = &slotWaiter[S]{ch: make(chan slotGrant[S], 1), targeted: launch}
	q.waiters = append(q.waiters, w)
	return slot, w, nil
}

// claimLaunch reports whether a launch is needed, and if so counts it as
// in flight: more calls wait than launches are in flight (at target 1;
// launchNeeded), and the pool is below max. The caller must follow with
// launched, launchFailed or unclaim.
func (q *slotQueue[S]) claimLaunch() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if launchNeeded(len(q.waiters), q.busy, q.total(), q.starting, q.target) && q.belowMax() {
		q.starting++
		return true
	}
	return false
}

// claimWarm counts as in flight the launches that bring the pool to n
// slots in all (idle, busy and starting), within max, and returns how
// many it claimed. The caller follows each with launched, launchFailed or
// unclaim, as for claimLaunch.
func (q *slotQueue[S]) claimWarm(n int) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := n - q.total()
	if q.max > 0 {
		k = min(k, q.max-q.total())
	}
	if k <= 0 {
		return 0
	}
	q.starting += k
	return k
}

// claimSpare claims one launch when the pool has no idle slot and none
// starting (at target 1; spareNeeded), within max: a spare for the next
// call. The caller follows as for claimLaunch.
func (q *slotQueue[S]) claimSpare() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !spareNeeded(len(q.idle), len(q.waiters), q.busy, q.starting, q.target) || !q.belowMax() {
		return false
	}
	q.starting++
	return true
}

// claimBeyondTarget claims one launch within max whatever the target
// concurrency says (Engine.launchOverTarget). The caller follows as for
// claimLaunch.
func (q *slotQueue[S]) claimBeyondTarget() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.belowMax() {
		return false
	}
	q.starting++
	return true
}

// unclaim takes back a claimed launch that never started.
func (q *slotQueue[S]) unclaim() {
	q.mu.Lock()
	q.starting--
	q.mu.Unlock()
}

// launched counts a launch as done and gives its slot to target if target
// still waits, else as put does. idle and seq say whether it went idle.
func (q *slotQueue[S]) launched(slot S, target *slotWaiter[S]) (idle bool, seq uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.starting--
	if target != nil && !target.done {
		q.grantLocked(target, slotGrant[S]{slot: slot})
		q.busy++
		return false, 0
	}
	return q.giveLocked(slot)
}

// launchFailed counts a launch as done and gives its error to target if
// target still waits; otherwise to the longest-waiting untargeted waiter,
// if more calls now wait than launches are in flight (that waiter was
// counting on this launch). It reports whether anyone received the error.
func (q *slotQueue[S]) launchFailed(err error, target *slotWaiter[S]) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.starting--
	if target != nil && !target.done {
		q.grantLocked(target, slotGrant[S]{err: err})
		return true
	}
	if !launchNeeded(len(q.waiters), q.busy, q.total(), q.starting, q.target) {
		return false
	}
	for _, w := range q.waiters {
		if !w.targeted {
			q.grantLocked(w, slotGrant[S]{err: err})
			return true
		}
	}
	return false
}

// put returns a busy slot: to the longest waiter, else onto the idle stack.
func (q *slotQueue[S]) put(slot S) (idle bool, seq uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.busy--
	return q.giveLocked(slot)
}

func (q *slotQueue[S]) giveLocked(slot S) (bool, uint64) {
	if len(q.waiters) > 0 {
		q.grantLocked(q.waiters[0], slotGrant[S]{slot: slot})
		q.busy++
		return false, 0
	}
	q.seq++
	q.idle = append(q.idle, idleSlot[S]{slot: slot, seq: q.seq, since: q.now()})
	return true, q.seq
}

// grantLocked removes w from the waiters and sends it g.
func (q *slotQueue[S]) grantLocked(w *slotWaiter[S], g slotGrant[S]) {
	if i := slices.Index(q.waiters, w); i >= 0 {
		q.waiters = slices.Delete(q.waiters, i, i+1)
	}
	w.done = true
	w.ch <- g
}

// retire forgets a busy slot that will not come back (its container is
// being removed).
func (q *slotQueue[S]) retire() {
	q.mu.Lock()
	q.busy--
	q.mu.Unlock()
}

// cancel withdraws w. If w was granted a slot meanwhile, that slot is
// returned (ok) and counts as busy: the caller uses it or puts it back. A
// granted error is dropped. A launch targeted at w stays in flight and its
// slot goes to whoever waits when it lands.
func (q *slotQueue[S]) cancel(w *slotWaiter[S]) (slot S, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !w.done {
		w.done = true
		if i := slices.Index(q.waiters, w); i >= 0 {
			q.waiters = slices.Delete(q.waiters, i, i+1)
		}
		return slot, false
	}
	select {
	case g := <-w.ch:
		if g.err == nil {
			return g.slot, true
		}
	default:
	}
	return slot, false
}

// removeIdle takes slot off the idle stack if it is still idle in the
// period seq (0 matches any period), for idle removal and eviction.
func (q *slotQueue[S]) removeIdle(slot S, seq uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, s := range q.idle {
		if s.slot == slot && (seq == 0 || s.seq == seq) {
			q.idle = slices.Delete(q.idle, i, i+1)
			return true
		}
	}
	return false
}

// isIdle reports whether slot is idle in the period seq.
func (q *slotQueue[S]) isIdle(slot S, seq uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, s := range q.idle {
		if s.slot == slot && s.seq == seq {
			return true
		}
	}
	return false
}

// idleSlots is a copy of the idle stack, least recently used first.
func (q *slotQueue[S]) idleSlots() []idleSlot[S] {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.idle)
}

// queueStats are a pool's counts at one moment.
type queueStats struct {
	Idle, Busy, Starting, Waiting int
}

func (q *slotQueue[S]) stats() queueStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return queueStats{Idle: len(q.idle), Busy: q.busy, Starting: q.starting, Waiting: len(q.waiters)}
}
