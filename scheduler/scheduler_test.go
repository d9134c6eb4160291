package scheduler

import (
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

const gib = int64(1) << 30

func cpuNode(id string, cpu float64, mem int64) Node {
	return Node{ID: id, Ready: true, CPU: cpu, MemoryBytes: mem}
}

func gpuNode(id string, n int, model string) Node {
	node := Node{ID: id, Ready: true, CPU: 64, MemoryBytes: 512 * gib}
	for i := 0; i < n; i++ {
		node.GPUs = append(node.GPUs, GPU{UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: model, MemoryBytes: 80 * gib})
	}
	return node
}

func TestPrefersNodeHoldingImage(t *testing.T) {
	a, b := cpuNode("a", 4, 8*gib), cpuNode("b", 4, 16*gib)
	a.Images = map[string]bool{"img@sha256:x": true}
	p := Schedule(Snapshot{Nodes: []Node{a, b}, Pending: []Run{{ID: "r", Image: "img@sha256:x", CPU: 1}}})
	if len(p.Placements) != 1 || p.Placements[0].NodeID != "a" {
		t.Fatalf("placements = %+v, want on a (holds image)", p.Placements)
	}
}

func TestSpreadsCPURunsAndCountsEarlierPlacements(t *testing.T) {
	p := Schedule(Snapshot{
		Nodes:   []Node{cpuNode("a", 2, 4*gib), cpuNode("b", 2, 4*gib)},
		Pending: []Run{{ID: "1", CPU: 1, MemoryBytes: 2 * gib}, {ID: "2", CPU: 1, MemoryBytes: 2 * gib}, {ID: "3", CPU: 1, MemoryBytes: 2 * gib}, {ID: "4", CPU: 1, MemoryBytes: 2 * gib}, {ID: "5", CPU: 1, MemoryBytes: 2 * gib}},
	})
	per := map[string]int{}
	for _, pl := range p.Placements {
		per[pl.NodeID]++
	}
	if per["a"] != 2 || per["b"] != 2 {
		t.Fatalf("per node = %v, want 2 and 2", per)
	}
	if !strings.Contains(p.Waiting["5"], "2 nodes have too little free CPU") {
		t.Fatalf("reason = %q", p.Waiting["5"])
	}
}

func TestPacksGPUsAndNeverDoubleBooks(t *testing.T) {
	big, small := gpuNode("big", 8, "NVIDIA H100 80GB HBM3"), gpuNode("small", 8, "NVIDIA H100 80GB HBM3")
	small.UsedGPUs = map[string]bool{"GPU-small-0": true, "GPU-small-1": true, "GPU-small-2": true, "GPU-small-3": true, "GPU-small-4": true, "GPU-small-5": true}
	p := Schedule(Snapshot{Nodes: []Node{big, small}, Pending: []Run{{ID: "r1", GPUs: 2, GPUModel: "h100"}, {ID: "r2", GPUs: 4}}})
	if len(p.Placements) != 2 {
		t.Fatalf("placements %+v waiting %v", p.Placements, p.Waiting)
	}
	if p.Placements[0].NodeID != "small" || strings.Join(p.Placements[0].GPUs, ",") != "GPU-small-6,GPU-small-7" {
		t.Fatalf("r1 = %+v, want the two free GPUs of the fuller node", p.Placements[0])
	}
	if p.Placements[1].NodeID != "big" || len(p.Placements[1].GPUs) != 4 {
		t.Fatalf("r2 = %+v", p.Placements[1])
	}
}

func TestExplainsWaiting(t *testing.T) {
	down := cpuNode("c", 8, 8*gib)
	down.Ready, down.NotReadyReason = false, "is unreachable"
	cord := gpuNode("d", 8, "A100")
	cord.Cordoned = true
	p := Schedule(Snapshot{Nodes: []Node{gpuNode("a", 2, "H100"), gpuNode("b", 1, "H100"), down, cord}, Pending: []Run{{ID: "r", GPUs: 4}}})
	got := p.Waiting["r"]
	for _, want := range []string{"2 nodes have fewer than 4 matching GPUs", "1 node is unreachable", "1 node is cordoned"} {
		if !strings.Contains(got, want) {
			t.Errorf("reason %q lacks %q", got, want)
		}
	}
	if got := Schedule(Snapshot{Pending: []Run{{ID: "r"}}}).Waiting["r"]; !strings.Contains(got, "no nodes are enrolled") {
		t.Errorf("empty fleet reason = %q", got)
	}
}

// TestPropertyNoOvercommit checks over random fleets and workloads that no
// node is over capacity, no GPU is handed out twice, and a run is left
// waiting only if it fits nowhere given what was placed before it.
func TestPropertyNoOvercommit(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for trial := 0; trial < 300; trial++ {
		var nodes []Node
		for i := 0; i < 1+rng.Intn(6); i++ {
			n := gpuNode(fmt.Sprint("n", i), rng.Intn(9), []string{"H100", "A100"}[rng.Intn(2)])
			n.CPU, n.MemoryBytes = float64(1+rng.Intn(16)), int64(1+rng.Intn(64))*gib
			n.Ready = rng.Intn(5) > 0
			nodes = append(nodes, n)
		}
		var runs []Run
		for i := 0; i < rng.Intn(30); i++ {
			runs = append(runs, Run{ID: fmt.Sprint("r", i), CPU: float64(rng.Intn(4)), MemoryBytes: int64(rng.Intn(8)) * gib, GPUs: rng.Intn(4)})
		}
		p := Schedule(Snapshot{Nodes: nodes, Pending: runs})
		cpu, mem, gpus := map[string]float64{}, map[string]int64{}, map[string]bool{}
		runByID := map[string]Run{}
		for _, r := range runs {
			runByID[r.ID] = r
		}
		for _, pl := range p.Placements {
			r := runByID[pl.RunID]
			cpu[pl.NodeID] += r.CPU
			mem[pl.NodeID] += r.MemoryBytes
			if len(pl.GPUs) != r.GPUs {
				t.Fatalf("run %s got %d GPUs, want %d", r.ID, len(pl.GPUs), r.GPUs)
			}
			for _, g := range pl.GPUs {
				if gpus[g] {
					t.Fatalf("trial %d: GPU %s double-booked", trial, g)
				}
				gpus[g] = true
			}
		}
		for _, n := range nodes {
			if cpu[n.ID] > n.CPU || mem[n.ID] > n.MemoryBytes {
				t.Fatalf("trial %d: node %s over capacity", trial, n.ID)
			}
			if !n.Ready && (cpu[n.ID] > 0 || mem[n.ID] > 0) {
				t.Fatalf("trial %d: work placed on unready node %s", trial, n.ID)
			}
		}
		if len(p.Placements)+len(p.Waiting) != len(runs) {
			t.Fatalf("trial %d: %d placed + %d waiting != %d runs", trial, len(p.Placements), len(p.Waiting), len(runs))
		}
		for id, why := range p.Waiting {
			if why == "" {
				t.Fatalf("run %s waits without a reason", id)
			}
		}
	}
}

// TestSkipsDisputedAndRepeatedGPUs: a node that lists one device four times
// has one device, and a disputed device is never handed out (once, four
// copies of "GPU-dup" went to one run).
func TestSkipsDisputedAndRepeatedGPUs(t *testing.T) {
	liar := Node{ID: "liar", Ready: true, CPU: 64, MemoryBytes: 512 * gib}
	for i := 0; i < 4; i++ {
		liar.GPUs = append(liar.GPUs, GPU{UUID: "GPU-dup", Model: "H100", MemoryBytes: 80 * gib})
	}
	honest := gpuNode("honest", 2, "H100")
	honest.GPUs[0].Disputed = true
	p := Schedule(Snapshot{Nodes: []Node{liar, honest}, Pending: []Run{{ID: "four", GPUs: 4}, {ID: "two", GPUs: 2}, {ID: "one", GPUs: 1}, {ID: "again", GPUs: 1}}})
	handed := map[string]int{}
	for _, pl := range p.Placements {
		for _, g := range pl.GPUs {
			handed[g]++
		}
	}
	if len(p.Placements) != 2 || len(handed) != 2 || handed["GPU-dup"] != 1 || handed["GPU-honest-1"] != 1 {
		t.Fatalf("placements = %+v, want only one GPU-dup and GPU-honest-1 handed out", p.Placements)
	}
	if !strings.Contains(p.Waiting["four"], "2 nodes have fewer than 4 matching GPUs") || !strings.Contains(p.Waiting["two"], "2 nodes have fewer than 2 matching GPUs") {
		t.Fatalf("waiting = %v, want the disputed and repeated GPUs not counted", p.Waiting)
	}
	if !reflect.DeepEqual(p, referenceSchedule(Snapshot{Nodes: []Node{liar, honest}, Pending: []Run{{ID: "four", GPUs: 4}, {ID: "two", GPUs: 2}, {ID: "one", GPUs: 1}, {ID: "again", GPUs: 1}}})) {
		t.Fatal("the indexed scheduler and the reference disagree")
	}
}
