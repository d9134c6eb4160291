package project

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// TestHistoryHalfLife: a project's history moves half-way to its current
// share in one half-life, and a share gone fades the same way.
func TestHistoryHalfLife(t *testing.T) {
	var h History
	h.Decay(map[string]float64{"a": 0}, t0, time.Hour)
	h.Decay(map[string]float64{"a": 0.8}, t0.Add(time.Hour), time.Hour)
	if got := h.Of("a"); math.Abs(got-0.4) > 1e-9 {
		t.Errorf("after one half-life at 0.8: %g, want 0.4", got)
	}
	h.Decay(map[string]float64{"a": 0}, t0.Add(3*time.Hour), time.Hour)
	if got := h.Of("a"); math.Abs(got-0.1) > 1e-9 {
		t.Errorf("two half-lives idle later: %g, want 0.1", got)
	}
	if h.Of("never") != 0 {
		t.Error("a project never seen has history")
	}
}

// TestConstraintsWithPools: a project's pools become the accepted values of
// the pool label, unless the run names a pool, which must be one of them.
func TestConstraintsWithPools(t *testing.T) {
	if Constraints(api.RunSpec{}, nil) != nil {
		t.Error("no constraints and no pools should be none")
	}
	got := Constraints(api.RunSpec{Constraints: map[string]string{"zone": "b"}}, []string{"a", "b"})
	if !slices.Equal(got["pool"], []string{"a", "b"}) || !slices.Equal(got["zone"], []string{"b"}) {
		t.Errorf("constraints %v", got)
	}
	got = Constraints(api.RunSpec{Constraints: map[string]string{"pool": "b"}}, []string{"a", "b"})
	if !slices.Equal(got["pool"], []string{"b"}) {
		t.Errorf("a pool inside the project's: %v", got)
	}
	got = Constraints(api.RunSpec{Constraints: map[string]string{"pool": "c"}}, []string{"a", "b"})
	if len(got["pool"]) != 1 || got["pool"][0] != "c (outside the project's pools)" {
		t.Errorf("a pool outside the project's: %v", got)
	}
}

// TestQueueRank: positions per project by priority then submission, the
// runs just ahead (at most three), and the k-th run's earliest start from
// the k-th running deadline.
func TestQueueRank(t *testing.T) {
	run := func(id, project string, priority int, at time.Duration) store.Run {
		return store.Run{Run: api.Run{ID: id, RunSpec: api.RunSpec{Project: project, Priority: priority}, CreatedAt: t0.Add(at)}}
	}
	var q Queue
	q.Rank([]store.Run{run("r5", "a", 0, 5), run("r1", "a", 0, 1), run("r9", "a", 9, 9), run("r2", "a", 0, 2), run("r3", "a", 0, 3), run("b1", "", 0, 0)}, nil,
		[]time.Time{t0.Add(time.Minute)})
	pos, ok := q.Position("r5")
	if !ok || pos.Position != 5 || pos.Of != 5 || !slices.Equal(pos.Ahead, []string{"r1", "r2", "r3"}) || pos.EarliestStart != nil {
		t.Errorf("r5: %+v", pos)
	}
	if first, _ := q.Position("r9"); first.Position != 1 || first.EarliestStart == nil || !first.EarliestStart.Equal(t0.Add(time.Minute)) {
		t.Errorf("r9: %+v", first)
	}
	if d, _ := q.Position("b1"); d.Project != api.DefaultProject || d.Position != 1 {
		t.Errorf("b1: %+v", d)
	}
	if got := q.Ordered("a"); !slices.Equal(got, []string{"r9", "r1", "r2", "r3", "r5"}) {
		t.Errorf("a's queue %v", got)
	}
	if got := q.Ordered(""); len(got) != 6 || got[0] != "r9" || got[5] != "b1" {
		t.Errorf("every queue %v", got)
	}
}

// TestQueueRankInTheSchedulersOrder: given the scheduler's order across
// projects, the queue is listed in it (interleaved), each run's position
// being its place among its project's runs in that order; a waiting run
// the order does not name (placed too late, say) follows.
func TestQueueRankInTheSchedulersOrder(t *testing.T) {
	run := func(id, project string, at time.Duration) store.Run {
		return store.Run{Run: api.Run{ID: id, RunSpec: api.RunSpec{Project: project}, CreatedAt: t0.Add(at)}}
	}
	var q Queue
	q.Rank([]store.Run{run("a1", "a", 1), run("a2", "a", 2), run("a3", "a", 3), run("b1", "b", 4), run("b2", "b", 5), run("late", "b", 6)},
		[]string{"a1", "b1", "a2", "b2", "a3", "gone"}, nil)
	if got := q.Ordered(""); !slices.Equal(got, []string{"a1", "b1", "a2", "b2", "a3", "late"}) {
		t.Errorf("every queue %v", got)
	}
	if got := q.Ordered("b"); !slices.Equal(got, []string{"b1", "b2", "late"}) {
		t.Errorf("b's queue %v", got)
	}
	if p, _ := q.Position("b2"); p.Position != 2 || p.Of != 3 || !slices.Equal(p.Ahead, []string{"b1"}) {
		t.Errorf("b2: %+v", p)
	}
	if p, _ := q.Position("a3"); p.Position != 3 || p.Of != 3 || !slices.Equal(p.Ahead, []string{"a1", "a2"}) {
		t.Errorf("a3: %+v", p)
	}
}
