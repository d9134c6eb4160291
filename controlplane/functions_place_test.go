package controlplane

import (
	"fmt"
	"testing"

	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/scheduler"
)

func shareNode(id string, mem int64, gpuModels ...string) fnNode {
	n := fnNode{ID: id, Share: capability.FunctionCapacity{MemoryBytes: mem, MilliCPUs: 2000}, GPUModels: gpuModels}
	for i := range gpuModels {
		n.Share.GPUs = append(n.Share.GPUs, fmt.Sprintf("GPU-%s-%d", id, i))
	}
	return n
}

// TestPlaceFnFits: only nodes whose share can hold one container are
// candidates; GPUs count by model.
func TestPlaceFnFits(t *testing.T) {
	nodes := []fnNode{shareNode("small", 64<<20), shareNode("big", 4<<30), shareNode("h100", 4<<30, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
		shareNode("a10", 4<<30, "NVIDIA A10")}
	ids := func(ns []fnNode) map[string]bool {
		m := map[string]bool{}
		for _, n := range ns {
			m[n.ID] = true
		}
		return m
	}
	if got := ids(placeFn("f", nodes, fnNeed{MemoryBytes: 128 << 20})); len(got) != 3 || got["small"] {
		t.Errorf("128 MiB fits %v, want every node but small", got)
	}
	if got := ids(placeFn("f", nodes, fnNeed{MemoryBytes: 128 << 20, GPUs: 2, GPUModel: "h100"})); len(got) != 1 || !got["h100"] {
		t.Errorf("2 H100 fit %v", got)
	}
	if got := ids(placeFn("f", nodes, fnNeed{MemoryBytes: 128 << 20, GPUs: 1})); len(got) != 2 || !got["a10"] || !got["h100"] {
		t.Errorf("1 GPU of any model fits %v", got)
	}
	if got := placeFn("f", nodes, fnNeed{MemoryBytes: 128 << 20, MilliCPUs: 4000}); len(got) != 0 {
		t.Errorf("4 cores fit %v, want none", got)
	}
}

// TestPlaceFnConsistent: a function's order is stable, functions spread
// over the nodes, and removing a node moves only the functions that ranked
// it first.
func TestPlaceFnConsistent(t *testing.T) {
	var nodes []fnNode
	for i := 0; i < 10; i++ {
		nodes = append(nodes, shareNode(fmt.Sprintf("node-%d", i), 1<<30))
	}
	need := fnNeed{MemoryBytes: 128 << 20}
	first := map[string]string{}
	perNode := map[string]int{}
	for f := 0; f < 2000; f++ {
		fn := fmt.Sprintf("fn-%d", f)
		order := placeFn(fn, nodes, need)
		if again := placeFn(fn, nodes, need); again[0].ID != order[0].ID || again[9].ID != order[9].ID {
			t.Fatalf("%s: order changed between two placements", fn)
		}
		first[fn] = order[0].ID
		perNode[order[0].ID]++
	}
	for id, n := range perNode {
		if n < 120 || n > 280 {
			t.Errorf("%s is first for %d of 2000 functions; want about 200", id, n)
		}
	}
	moved := 0
	for fn, was := range first {
		now := placeFn(fn, nodes[1:], need)[0].ID
		if now != was {
			moved++
			if was != "node-0" {
				t.Errorf("%s moved from %s to %s when node-0 left", fn, was, now)
			}
		}
	}
	if moved != perNode["node-0"] {
		t.Errorf("%d functions moved, want the %d that ranked node-0 first", moved, perNode["node-0"])
	}
}

// TestReserveFunctionShare: the scheduler counts a node's function share
// as used.
func TestReserveFunctionShare(t *testing.T) {
	sn := scheduler.Node{ID: "n", CPU: 8, MemoryBytes: 32 << 30, UsedGPUs: map[string]bool{}}
	reserveFunctionShare(&sn, &capability.NodeFacts{Functions: &capability.FunctionCapacity{MemoryBytes: 8 << 30, MilliCPUs: 2000, GPUs: []string{"GPU-1"}}})
	if sn.UsedMemory != 8<<30 || sn.UsedCPU != 2 || !sn.UsedGPUs["GPU-1"] {
		t.Errorf("node after the share = %+v", sn)
	}
	reserveFunctionShare(&sn, &capability.NodeFacts{})
	if sn.UsedMemory != 8<<30 {
		t.Errorf("a node without functions reserved %d", sn.UsedMemory-8<<30)
	}
}
