package scheduler

import (
	"fmt"
	"slices"
	"testing"

	"github.com/mercator/mercator/nodeproto"
)

func shareNode(id string, mem int64, gpuModels ...string) FunctionNode {
	n := FunctionNode{ID: id, Share: nodeproto.FunctionCapacity{MemoryBytes: mem, MilliCPUs: 2000}, GPUModels: gpuModels}
	for i := range gpuModels {
		n.Share.GPUs = append(n.Share.GPUs, fmt.Sprintf("GPU-%s-%d", id, i))
	}
	return n
}

// TestPlaceFunctionFits: only nodes whose share can hold one container are
// candidates; GPUs count by model.
func TestPlaceFunctionFits(t *testing.T) {
	nodes := []FunctionNode{shareNode("small", 64<<20), shareNode("big", 4<<30), shareNode("h100", 4<<30, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
		shareNode("a10", 4<<30, "NVIDIA A10")}
	for _, tc := range []struct {
		name string
		need FunctionNeed
		want []string // the fitting nodes, sorted
	}{
		{"memory", FunctionNeed{MemoryBytes: 128 << 20}, []string{"a10", "big", "h100"}},
		{"two GPUs of a model", FunctionNeed{MemoryBytes: 128 << 20, GPUs: 2, GPUModel: "h100"}, []string{"h100"}},
		{"one GPU of any model", FunctionNeed{MemoryBytes: 128 << 20, GPUs: 1}, []string{"a10", "h100"}},
		{"more CPU than any share", FunctionNeed{MemoryBytes: 128 << 20, MilliCPUs: 4000}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, n := range PlaceFunction("f", nodes, tc.need) {
				got = append(got, n.ID)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("PlaceFunction(%v) = %v, want %v", tc.need, got, tc.want)
			}
		})
	}
}

// TestPlaceFunctionConsistent: a function's order is stable, functions spread
// over the nodes, and removing a node moves only the functions that ranked
// it first.
func TestPlaceFunctionConsistent(t *testing.T) {
	var nodes []FunctionNode
	for i := 0; i < 10; i++ {
		nodes = append(nodes, shareNode(fmt.Sprintf("node-%d", i), 1<<30))
	}
	need := FunctionNeed{MemoryBytes: 128 << 20}
	first := map[string]string{}
	perNode := map[string]int{}
	for f := 0; f < 2000; f++ {
		fn := fmt.Sprintf("fn-%d", f)
		order := PlaceFunction(fn, nodes, need)
		if again := PlaceFunction(fn, nodes, need); again[0].ID != order[0].ID || again[9].ID != order[9].ID {
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
		now := PlaceFunction(fn, nodes[1:], need)[0].ID
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
