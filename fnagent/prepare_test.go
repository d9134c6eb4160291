package fnagent

import (
	"testing"
	"time"
)

// TestSpareRoom: without a hold, a pool may make a spare while fewer than
// MaxSpares unheld pools have one; at the limit it takes the place of the
// least recently used, and only of one used before it. Held pools neither
// count nor give way.
func TestSpareRoom(t *testing.T) {
	now := time.Unix(1000, 0)
	e := &Engine{cfg: Config{MaxSpares: 2, SpareFor: time.Hour}, now: func() time.Time { return now }, pools: map[string]*pool{}}
	mk := func(key string, used time.Duration, prepared, held bool) *pool {
		p := &pool{key: key, fn: FunctionConfig{ID: key}, lastUse: now.Add(-used)}
		if prepared {
			p.prepared = &hotContainer{name: key}
		}
		if held {
			p.holdUntil = now.Add(time.Minute)
		}
		e.pools[key] = p
		return p
	}
	old := mk("old", 10*time.Minute, true, false)
	mk("held", time.Hour, true, true)
	p := mk("new", 0, false, false)
	if ok, evicted := e.spareRoomLocked(p); !ok || evicted != nil {
		t.Fatalf("one unheld spare of 2: room %v, evicted %v; want room, nothing evicted", ok, evicted)
	}
	recent := mk("recent", time.Minute, true, false)
	ok, evicted := e.spareRoomLocked(p)
	if !ok || evicted == nil || evicted.name != "old" || old.prepared != nil {
		t.Fatalf("at the limit: room %v, evicted %v; want the least recently used (old) taken off its pool", ok, evicted)
	}
	// Now at the limit again with recent and a newer one: a pool used
	// before all of them gets no room.
	mk("newer", 0, true, false)
	stale := mk("stale", 2*time.Hour, false, false)
	if ok, evicted := e.spareRoomLocked(stale); ok || evicted != nil {
		t.Fatalf("a pool older than every spare: room %v, evicted %v; want none", ok, evicted)
	}
	if recent.prepared == nil {
		t.Fatal("a spare was taken off for a pool that got no room")
	}
	e.cfg.MaxSpares = -1
	if ok, _ := e.spareRoomLocked(p); ok {
		t.Fatal("spares off (MaxSpares < 0): room given")
	}
}

// TestPreparedUntil: a pool keeps its prepared container until the later
// of its hold's lapse and SpareFor after its last use; with spares off,
// only while the hold stands; a pool never used or held keeps none.
func TestPreparedUntil(t *testing.T) {
	now := time.Unix(1000, 0)
	e := &Engine{cfg: Config{MaxSpares: 4, SpareFor: time.Hour}, now: func() time.Time { return now }}
	p := &pool{}
	if e.keepsPreparedLocked(p) {
		t.Fatal("a pool never used or held keeps a prepared container")
	}
	p.lastUse = now.Add(-59 * time.Minute)
	if got := e.preparedUntilLocked(p); !got.Equal(now.Add(time.Minute)) || !e.keepsPreparedLocked(p) {
		t.Fatalf("used 59m ago: kept until %v; want an hour after the use", got)
	}
	p.holdUntil = now.Add(2 * time.Hour)
	if got := e.preparedUntilLocked(p); !got.Equal(p.holdUntil) {
		t.Fatalf("with a longer hold: kept until %v; want the hold's lapse", got)
	}
	e.cfg.MaxSpares = -1
	p.holdUntil = now.Add(-time.Second)
	if e.keepsPreparedLocked(p) {
		t.Fatal("spares off and the hold lapsed: still kept")
	}
}

// TestSpareWithoutHold, on the daemon: a function called without any hold
// keeps a prepared container once its call's container is up; after the
// idle timeout took that one (a scale to zero) the next call starts the
// prepared container; with MaxSpares 1 another function's spare takes its
// place; a new configuration of the function supersedes its spare; and
// Forget removes every container the engine kept for it.
func TestSpareWithoutHold(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, func(c *Config) { c.MaxSpares = 1 })
	fn := fnConfig(t, "spare", rawImage)
	fn.IdleTimeout = 500 * time.Millisecond
	prepared := func(id string) string {
		for _, c := range te.containers() {
			if c.State == "created" && c.Labels["mercator.fn"] == id {
				return c.ID
			}
		}
		return ""
	}
	first := te.mustCall(fn, "echo", "x")
	if first.report.Launch == nil || first.report.Launch.Prepared {
		t.Fatalf("the first call's launch %+v; want a plain create", first.report.Launch)
	}
	eventually(t, 30*time.Second, "a spare prepared after the first call, counted as prepared", func() bool {
		return prepared(fn.ID) != "" && te.counts.Snapshot().Containers[ContainerPrepared] == 1
	})
	spare := prepared(fn.ID)
	eventually(t, 30*time.Second, "the first container gone after its idle timeout", func() bool { return te.state(first.report.ContainerID) == "gone" })
	second := te.mustCall(fn, "echo", "y")
	if !second.report.Cold || second.report.ContainerID != spare || second.report.Launch == nil || !second.report.Launch.Prepared {
		t.Fatalf("the call after the scale to zero ran in %s (cold %v, launch %+v); want the spare %s started", second.report.ContainerID, second.report.Cold, second.report.Launch, spare)
	}
	eventually(t, 30*time.Second, "the next spare prepared", func() bool { return prepared(fn.ID) != "" && prepared(fn.ID) != spare })
	spare = prepared(fn.ID)

	// Another function, called more recently, takes the only spare's place.
	other := fnConfig(t, "spare-other", rawImage)
	te.mustCall(other, "echo", "z")
	eventually(t, 30*time.Second, "the other function's spare in place of the first's", func() bool {
		return prepared(other.ID) != "" && te.state(spare) == "gone"
	})

	// A new configuration of the other function supersedes its spare.
	otherSpare := prepared(other.ID)
	changed := other
	changed.Config = map[string]string{"CHANGED": "1"}
	te.mustCall(changed, "echo", "w")
	eventually(t, 30*time.Second, "the old configuration's spare removed", func() bool { return te.state(otherSpare) == "gone" })

	// Forget: nothing of the function is left, started or prepared.
	eventually(t, 30*time.Second, "the new configuration's container idle", func() bool {
		for _, s := range te.Stats() {
			if s.FnID == other.ID && s.Busy == 0 && s.Idle > 0 {
				return true
			}
		}
		return false
	})
	te.Forget(other.ID)
	eventually(t, 30*time.Second, "no container of the forgotten function", func() bool {
		for _, c := range te.containers() {
			if c.Labels["mercator.fn"] == other.ID {
				return false
			}
		}
		return true
	})
}
