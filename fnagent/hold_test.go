package fnagent

import (
	"testing"
	"time"
)

// TestHoldKeepsContainersWarm: a hold pulls the image and starts its count
// of containers before any call, keeps them past the idle timeout while it
// stands (a function without a hold, idle since later, is gone first), the
// next call finds one warm, and once the hold lapses they age out.
func TestHoldKeepsContainersWarm(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	held := fnConfig(t, "held", rawImage)
	held.IdleTimeout = 300 * time.Millisecond
	free := fnConfig(t, "free", rawImage)
	free.IdleTimeout = 300 * time.Millisecond
	count := func(id string) (idle, all int) {
		for _, s := range te.Stats() {
			if s.FnID == id {
				idle += s.Idle + s.Paused
				all += s.Idle + s.Paused + s.Busy + s.Starting
			}
		}
		return idle, all
	}

	if err := te.Hold(held, 2, time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "two held containers started", func() bool { idle, _ := count("held"); return idle == 2 })
	// A function without a hold, idle since after the held ones were.
	te.mustCall(free, "echo", "x")
	eventually(t, 30*time.Second, "the unheld function's container aged out", func() bool { _, all := count("free"); return all == 0 })
	if idle, _ := count("held"); idle != 2 {
		t.Fatalf("held containers after the idle timeout: %d idle, want 2", idle)
	}
	// The call takes a held container: none is started for it (the two
	// held ones stay, so a launch would make three).
	te.mustCall(held, "echo", "x")
	if _, all := count("held"); all != 2 {
		t.Errorf("containers after a call to the held function: %d, want the 2 held", all)
	}
	// A second hold replaces the first: lapsed at once, the containers
	// age out as any others.
	if err := te.Hold(held, 2, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the lapsed hold's containers aged out", func() bool { _, all := count("held"); return all == 0 })
}

// TestHoldStartsSpareAheadOfDemand: while a hold stands, a call that takes
// the pool's last idle container starts another, so the next call finds
// one started.
func TestHoldStartsSpareAheadOfDemand(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "spare", rawImage)
	state := func() (idle, busy, all int) {
		for _, s := range te.Stats() {
			if s.FnID == fn.ID {
				idle += s.Idle + s.Paused
				busy += s.Busy
				all += s.Idle + s.Paused + s.Busy + s.Starting
			}
		}
		return idle, busy, all
	}
	if err := te.Hold(fn, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the held container started", func() bool { idle, _, _ := state(); return idle == 1 })
	done := make(chan result)
	go func() { done <- te.call(fn, "sleep:8000", "") }()
	eventually(t, 30*time.Second, "a spare started beside the busy container", func() bool {
		idle, busy, all := state()
		return busy == 1 && idle == 1 && all == 2
	})
	if r := <-done; r.err != nil {
		t.Fatalf("the call that took the held container: %v", r.err)
	}
}

// TestPreparedContainer: a hold (a prefetch of none included) keeps one
// container created ahead; the next launch starts that very container
// rather than creating one, and once the hold lapses an unused one is
// removed.
func TestPreparedContainer(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "prepared", rawImage)
	created := func() string {
		for _, c := range te.containers() {
			if c.State == "created" {
				return c.ID
			}
		}
		return ""
	}
	ready := func() bool {
		for _, s := range te.Stats() {
			if s.FnID == fn.ID && s.Prepared == 1 {
				return true
			}
		}
		return false
	}
	if err := te.Hold(fn, 0, time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a container prepared", ready)
	prepared := created()
	r := te.mustCall(fn, "echo", "x")
	if r.report.ContainerID != prepared || !r.report.Cold {
		t.Errorf("the first call ran in %s (cold %v), want the prepared %s started", r.report.ContainerID, r.report.Cold, prepared)
	}
	// The hold still stands: the launch prepared the next one.
	eventually(t, 30*time.Second, "the next container prepared", func() bool { return ready() && created() != prepared })
	next := created()
	if err := te.Hold(fn, 0, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the unused prepared container removed after the hold lapsed", func() bool { return te.state(next) == "gone" })
}
