package fnagent

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestTargetConcurrencyRules(t *testing.T) {
	for _, c := range []struct {
		name                                  string
		idle, waiting, busy, starting, target int
		launch, waitBusy, spare               bool
	}{
		// Target 1, Fn's behaviour: a launch per waiting call, never a wait
		// for a busy container, a spare once no container is idle.
		{name: "t1 empty pool, one call waiting", waiting: 1, target: 1, launch: true, spare: true},
		{name: "t1 one waiting, its launch in flight", waiting: 1, starting: 1, target: 1},
		{name: "t1 all busy, nothing waits", busy: 3, target: 1, spare: true},
		{name: "t1 one idle", idle: 1, busy: 2, target: 1},
		{name: "t1 all busy, one starting", busy: 3, starting: 1, target: 1},
		// Target 2: two calls a container, busy and waiting, before another.
		{name: "t2 empty pool, one call waiting", waiting: 1, target: 2, launch: true, spare: true},
		{name: "t2 one busy, the next call waits", busy: 1, target: 2, waitBusy: true},
		{name: "t2 one busy, one waiting: at target", busy: 1, waiting: 1, target: 2, spare: true},
		{name: "t2 one busy, two waiting: beyond it", busy: 1, waiting: 2, target: 2, launch: true, spare: true},
		{name: "t2 beyond it, the launch in flight", busy: 1, waiting: 2, starting: 1, target: 2, waitBusy: true},
		{name: "t2 four busy of four", busy: 4, target: 2, waitBusy: true},
		{name: "t2 four busy, four waiting", busy: 4, waiting: 4, target: 2, spare: true},
		{name: "t2 one idle of two, one busy", idle: 1, busy: 1, target: 2, waitBusy: true},
		{name: "t3 one busy, two waiting", busy: 1, waiting: 2, target: 3, spare: true},
	} {
		containers := c.idle + c.busy + c.starting
		if got := launchNeeded(c.waiting, c.busy, containers, c.starting, c.target); got != c.launch {
			t.Errorf("%s: launchNeeded = %v, want %v", c.name, got, c.launch)
		}
		if got := waitForBusy(c.waiting, c.busy, containers, c.target); got != c.waitBusy {
			t.Errorf("%s: waitForBusy = %v, want %v", c.name, got, c.waitBusy)
		}
		if got := spareNeeded(c.idle, c.waiting, c.busy, c.starting, c.target); got != c.spare {
			t.Errorf("%s: spareNeeded = %v, want %v", c.name, got, c.spare)
		}
	}
}

// TestSlotQueueTargetConcurrency: at target 2 a pool of one busy container
// queues a NoWait call behind it instead of claiming a launch, launches for
// the demand beyond two a container, and gives the freed container to the
// longest waiter.
func TestSlotQueueTargetConcurrency(t *testing.T) {
	q := newSlotQueue[string](0, nil).withTarget(2)
	seedIdle(q, "a")
	if got, _ := mustAcquire(t, q, true); got != "a" {
		t.Fatalf("acquire = %q, want the idle a", got)
	}
	_, w1 := mustAcquire(t, q, true)
	if w1 == nil || w1.targeted {
		t.Fatalf("second call at target 2: waiter %+v, want one queued behind a, no launch claimed", w1)
	}
	if st := q.stats(); st.Starting != 0 || st.Waiting != 1 {
		t.Fatalf("stats = %+v, want one waiting and nothing starting", st)
	}
	if q.claimLaunch() {
		t.Fatal("claimLaunch at two calls for one container: want none at target 2")
	}
	_, w2 := mustAcquire(t, q, false)
	if !q.claimLaunch() {
		t.Fatal("three calls for one container: want a launch")
	}
	if q.claimLaunch() {
		t.Fatal("three calls for two containers (one starting): want no more")
	}
	q.put("a")
	if g := <-w1.ch; g.slot != "a" {
		t.Fatalf("freed a went to %+v, want the longest waiter", g)
	}
	q.launched("b", nil)
	if g := <-w2.ch; g.slot != "b" {
		t.Fatalf("the launch's b went to %+v, want the next waiter", g)
	}
	if q.withTarget(0).target != 1 {
		t.Fatal("target 0 reads as 1")
	}
}

// TestTargetConcurrencyOnTheEngine: at target 2, a call that finds the one
// container busy waits for it (NoWait included) instead of starting a
// second; a third call at once, beyond two a container, starts one. Real
// containers.
func TestTargetConcurrencyOnTheEngine(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "target", rawImage)
	fn.TargetConcurrency = 2
	te.mustCall(fn, "echo", "") // its one container, idle
	pool := func() (s PoolStats) {
		for _, p := range te.Stats() {
			if p.FnID == fn.ID {
				s.Idle, s.Busy, s.Starting, s.Waiting = s.Idle+p.Idle, s.Busy+p.Busy, s.Starting+p.Starting, s.Waiting+p.Waiting
			}
		}
		return s
	}
	done := make(chan result, 3)
	go func() { done <- te.call(fn, "sleep:3000", "") }()
	eventually(t, 30*time.Second, "the first call busy", func() bool { return pool().Busy == 1 })
	go func() { done <- te.call(fn, "echo", "", func(c *CallRequest) { c.Mode = NoWait }) }()
	eventually(t, 30*time.Second, "the second call waiting", func() bool { return pool().Waiting == 1 })
	if s := pool(); s.Starting != 0 {
		t.Fatalf("two calls for one container at target 2: %+v, want nothing starting", s)
	}
	go func() { done <- te.call(fn, "echo", "") }()
	for range 3 {
		if r := <-done; r.err != nil || r.rec.Code != 200 {
			t.Fatalf("call: %v, status %d", r.err, r.rec.Code)
		}
	}
	if s := pool(); s.Idle+s.Busy+s.Starting != 2 {
		t.Fatalf("after three calls at once: %+v, want 2 containers (the third call's demand went beyond two a container)", s)
	}
}

// TestUnframedLogsEnv: a function's containers are asked for log frames
// unless UnframedLogs, which leaves the contract's other variables as
// they are.
func TestUnframedLogsEnv(t *testing.T) {
	fn := FunctionConfig{ID: "f", Image: "r/fn@" + testDigest}
	framed, unframed := containerEnv(fn), containerEnv(FunctionConfig{ID: "f", Image: fn.Image, UnframedLogs: true})
	if !slices.Contains(framed, "FN_LOGFRAME_NAME="+logFrameName) || !slices.Contains(framed, "FN_LOGFRAME_HDR=Fn-Call-Id") {
		t.Errorf("framed env %v lacks the frame variables", framed)
	}
	for _, kv := range unframed {
		if strings.HasPrefix(kv, "FN_LOGFRAME_") {
			t.Errorf("unframed env has %s", kv)
		}
	}
	if len(framed)-len(unframed) != 2 {
		t.Errorf("unframed env %v, want framed %v less the two frame variables", unframed, framed)
	}
}

// TestTargetConcurrencyWaitIsBounded: at target 2, a call that waited
// MaxSlotWait behind a long busy call, with nothing starting, has a
// container started for it instead of failing with capacity_timeout.
func TestTargetConcurrencyWaitIsBounded(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, func(c *Config) { c.MaxSlotWait = 300 * time.Millisecond })
	fn := fnConfig(t, "target-bounded", rawImage)
	fn.TargetConcurrency = 2
	te.mustCall(fn, "echo", "")
	long := make(chan result, 1)
	go func() { long <- te.call(fn, "sleep:5000", "") }()
	eventually(t, 30*time.Second, "the long call busy", func() bool {
		for _, s := range te.Stats() {
			if s.FnID == fn.ID && s.Busy == 1 {
				return true
			}
		}
		return false
	})
	// Served at all before the long call ends, it was served cold: by a
	// second container, started for it once it had waited.
	if r := te.mustCall(fn, "echo", ""); !r.report.Cold {
		t.Errorf("the waiting call was not served by a container started for it: %+v", r.report)
	}
	if first := <-long; first.err != nil {
		t.Fatalf("the long call: %v", first.err)
	}
}
