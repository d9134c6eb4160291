package scheduler

import (
	"fmt"
	"slices"
	"testing"
)

// TestQueueOrderInterleavesByShare: with the fleet full, the waiting runs
// of two projects are in the order the passes would take them should room
// appear: guaranteed work first, then from the project with the least
// weighted share each time, so the projects interleave (by their weights)
// rather than one queue following the other. And that is the order the
// scheduler does take them as room appears: a node at a time, each plan
// places the head of the previous plan's order.
func TestQueueOrderInterleavesByShare(t *testing.T) {
	for _, c := range []struct {
		name     string
		projects []Project
		want     []string
	}{
		{"equal weights", []Project{{Name: "a"}, {Name: "b"}, {Name: "other"}},
			[]string{"a1", "b1", "a2", "b2", "a3", "b3"}},
		{"b weighs twice", []Project{{Name: "a"}, {Name: "b", Weight: 2}, {Name: "other"}},
			[]string{"a1", "b1", "b2", "a2", "b3", "a3"}},
		{"a's quota first", []Project{gpuQuota("a", 2, 1), {Name: "b"}, {Name: "other"}},
			[]string{"a1", "a2", "b1", "b2", "a3", "b3"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := Snapshot{Nodes: []Node{h100Node("n1")}, Projects: c.projects}
			hold(&s, 0, gpuRun("r-other", "other", 8, 0), 0)
			for k := 1; k <= 3; k++ { // a's submitted before b's
				s.Pending = append(s.Pending, gpuRun(fmt.Sprintf("a%d", k), "a", 1, 0))
			}
			for k := 1; k <= 3; k++ {
				s.Pending = append(s.Pending, gpuRun(fmt.Sprintf("b%d", k), "b", 1, 0))
			}
			plan := Schedule(s)
			if len(plan.Placements) != 0 {
				t.Fatalf("placed %+v on a full fleet", plan.Placements)
			}
			if !slices.Equal(plan.Order, c.want) {
				t.Errorf("order = %v, want %v", plan.Order, c.want)
			}
		})
	}
}

// TestQueueOrderIsTheOrderOfPlacement: on a fleet with room for the runs
// one GPU at a time, each plan places exactly the run the previous plan's
// order put first.
func TestQueueOrderIsTheOrderOfPlacement(t *testing.T) {
	s := Snapshot{Nodes: []Node{h100Node("n1")}, Projects: []Project{{Name: "a"}, {Name: "b", Weight: 3}, {Name: "other"}}}
	for k := range 8 {
		hold(&s, 0, gpuRun(fmt.Sprintf("r-other-%d", k), "other", 1, 0), int64(k))
	}
	for k := 1; k <= 4; k++ {
		s.Pending = append(s.Pending, gpuRun(fmt.Sprintf("a%d", k), "a", 1, 0), gpuRun(fmt.Sprintf("b%d", k), "b", 1, 0))
	}
	var placed []string
	order := Schedule(s).Order
	for len(s.Pending) > 0 {
		// One of other's runs ends: one GPU is free.
		s.Running = s.Running[1:]
		delete(s.Nodes[0].UsedGPUs, fmt.Sprintf("GPU-n1-%d", len(placed)))
		s.Nodes[0].UsedCPU -= 8
		s.Nodes[0].UsedMemory -= 64 * gib
		plan := Schedule(s)
		if len(plan.Placements) != 1 {
			t.Fatalf("one free GPU: placed %+v", plan.Placements)
		}
		p := plan.Placements[0]
		if p.RunID != order[0] {
			t.Fatalf("placed %s; the previous plan's order was %v", p.RunID, order)
		}
		placed = append(placed, p.RunID)
		i := slices.IndexFunc(s.Pending, func(r Run) bool { return r.ID == p.RunID })
		hold(&s, 0, s.Pending[i], int64(100+len(placed)))
		s.Pending = slices.Delete(s.Pending, i, i+1)
		order = plan.Order
	}
	t.Logf("placed in order %v", placed)
}
