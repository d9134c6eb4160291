package scheduler

import (
	"fmt"
	"testing"
)

// TestQuarantinedGPUNeverPlaced: a node with one quarantined card of eight
// takes a 7-GPU run on the other seven and no 8-GPU run, which goes to a
// healthy node instead.
func TestQuarantinedGPUNeverPlaced(t *testing.T) {
	node := func(id string, sick int) Node {
		n := Node{ID: id, Ready: true, CPU: 64, MemoryBytes: 1 << 40}
		for i := range 8 {
			n.GPUs = append(n.GPUs, GPU{UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, Quarantined: i == sick})
		}
		return n
	}
	sick := node("sick", 3)
	plan := Schedule(Snapshot{Nodes: []Node{sick}, Pending: []Run{{ID: "seven", GPUs: 7}, {ID: "eight", GPUs: 8}}})
	if len(plan.Placements) != 1 || plan.Placements[0].RunID != "seven" {
		t.Fatalf("placements %+v, want only the 7-GPU run", plan.Placements)
	}
	for _, g := range plan.Placements[0].GPUs {
		if g == "GPU-sick-3" {
			t.Fatalf("the quarantined GPU was placed: %v", plan.Placements[0].GPUs)
		}
	}
	plan = Schedule(Snapshot{Nodes: []Node{sick, node("well", -1)}, Pending: []Run{{ID: "eight", GPUs: 8}}})
	if len(plan.Placements) != 1 || plan.Placements[0].NodeID != "well" {
		t.Fatalf("placements %+v, want the 8-GPU run on the healthy node", plan.Placements)
	}
}
