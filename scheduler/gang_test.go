package scheduler

import (
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// withGangs makes about a tenth of runs gangs of 2–8 members.
func withGangs(rng *rand.Rand, runs []Run) []Run {
	for i := range runs {
		if rng.Intn(10) == 0 {
			runs[i].Nodes = 2 + rng.Intn(7)
		}
	}
	return runs
}

// TestPropertyGangsWholeOrNot: over random fleets and queues with gangs
// mixed in, no gang is ever partly placed (its members are all placed, on
// distinct nodes with ranks 0…N-1, or none are and it waits with a reason),
// no GPU is handed out twice and no node is given more than it has free;
// and the plan is the one the definition gives (the reference: each member
// on the best node no earlier member took), waiting gangs aside, whose
// reasons may count nodes as of the first gang of their shape that waited.
func TestPropertyGangsWholeOrNot(t *testing.T) {
	rng := rand.New(rand.NewSource(18))
	images := []string{"", "a@sha256:1", "b@sha256:2"}
	trials := 2000
	if testing.Short() {
		trials = 500
	}
	for trial := 0; trial < trials; trial++ {
		s := Snapshot{Nodes: randomFleet(rng, images, false), Pending: withGangs(rng, randomRuns(rng, images, rng.Intn(60)))}
		got := Schedule(s)
		checkWholeGangs(t, trial, s, got)
		want := referenceSchedule(s)
		if !reflect.DeepEqual(got.Placements, want.Placements) {
			t.Fatalf("trial %d: placements\n%+v\nreference\n%+v", trial, got.Placements, want.Placements)
		}
		for _, r := range s.Pending {
			g, w := got.Waiting[r.ID], want.Waiting[r.ID]
			if (g == "") != (w == "") || (r.Nodes <= 1 && g != w) || (r.Nodes > 1 && w != "" && !strings.HasPrefix(g, fmt.Sprintf("waiting: gang of %d: need %d nodes with", r.Nodes, r.Nodes))) {
				t.Fatalf("trial %d: run %+v waits %q, reference %q", trial, r, g, w)
			}
		}
	}
}

// checkWholeGangs holds a plan to the gang invariants and to capacity.
func checkWholeGangs(t *testing.T, trial int, s Snapshot, p Plan) {
	t.Helper()
	members := map[string][]Placement{}
	for _, pl := range p.Placements {
		members[pl.RunID] = append(members[pl.RunID], pl)
	}
	nodes := map[string]Node{}
	for _, n := range s.Nodes {
		nodes[n.ID] = n
	}
	cpu, mem, held := map[string]float64{}, map[string]int64{}, map[string]bool{}
	for _, r := range s.Pending {
		got := members[r.ID]
		want := max(r.Nodes, 1)
		if len(got) != 0 && len(got) != want {
			t.Fatalf("trial %d: run %s (nodes %d) placed %d members: %+v", trial, r.ID, r.Nodes, len(got), got)
		}
		if len(got) == 0 && p.Waiting[r.ID] == "" {
			t.Fatalf("trial %d: run %s neither placed nor waiting", trial, r.ID)
		}
		seen := map[string]bool{}
		for rank, pl := range got {
			if pl.Rank != rank || seen[pl.NodeID] {
				t.Fatalf("trial %d: gang %s members %+v: ranks not 0…N-1 or a node twice", trial, r.ID, got)
			}
			seen[pl.NodeID] = true
			cpu[pl.NodeID] += r.CPU
			mem[pl.NodeID] += r.MemoryBytes
			for _, g := range pl.GPUs {
				if held[g] || nodes[pl.NodeID].UsedGPUs[g] {
					t.Fatalf("trial %d: GPU %s handed out twice", trial, g)
				}
				held[g] = true
			}
		}
	}
	for id, c := range cpu {
		n := nodes[id]
		if c > n.CPU-n.UsedCPU+1e-9 || mem[id] > n.MemoryBytes-n.UsedMemory {
			t.Fatalf("trial %d: node %s over-committed: %g CPUs, %d bytes placed", trial, id, c, mem[id])
		}
	}
}

// TestGangWaitsSayingWhy: a gang of two 8-GPU members with one machine
// free waits whole, says how many nodes it needs and how many fit, and
// leaves that machine to the single run behind it.
func TestGangWaitsSayingWhy(t *testing.T) {
	node := func(id string, busy bool) Node {
		n := Node{ID: id, Ready: true, CPU: 64, MemoryBytes: 512 * gib, UsedGPUs: map[string]bool{}}
		for k := range 8 {
			uuid := fmt.Sprintf("GPU-%s-%d", id, k)
			n.GPUs = append(n.GPUs, GPU{UUID: uuid, Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 * gib})
			n.UsedGPUs[uuid] = busy
		}
		return n
	}
	s := Snapshot{Nodes: []Node{node("a", false), node("b", true)},
		Pending: []Run{{ID: "gang", GPUs: 8, GPUModel: "H100", Nodes: 2}, {ID: "single", GPUs: 8, GPUModel: "H100"}}}
	p := Schedule(s)
	if why := p.Waiting["gang"]; why != "waiting: gang of 2: need 2 nodes with 8 free H100 GPUs; 1 has" {
		t.Fatalf("gang waits %q", why)
	}
	if len(p.Placements) != 1 || p.Placements[0].RunID != "single" || p.Placements[0].NodeID != "a" {
		t.Fatalf("placements %+v, want only the single run, on a", p.Placements)
	}
	s.Nodes[1] = node("b", false)
	p = Schedule(s)
	if len(p.Placements) != 2 || p.Placements[0].RunID != "gang" || p.Placements[1].RunID != "gang" || p.Placements[0].NodeID == p.Placements[1].NodeID {
		t.Fatalf("with both free: placements %+v, want the gang on both", p.Placements)
	}
}

// TestGangWaitsWhileProjectsPlan: with projects planning the fleet, a gang
// is neither placed as one member nor preempted for; it waits saying so.
func TestGangWaitsWhileProjectsPlan(t *testing.T) {
	node := func(id string) Node {
		n := Node{ID: id, Ready: true, CPU: 64, MemoryBytes: 512 * gib}
		for k := range 8 {
			n.GPUs = append(n.GPUs, GPU{UUID: fmt.Sprintf("GPU-%s-%d", id, k), Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 * gib})
		}
		return n
	}
	s := Snapshot{Nodes: []Node{node("a"), node("b")}, Pending: []Run{{ID: "g", GPUs: 8, Nodes: 2, Project: "p"}},
		Projects: []Project{{Name: "p", GPUs: map[string]int{"H100": 16}}},
		Running:  []Running{{RunID: "low", NodeID: "a", Project: "p", Priority: -5, GPUs: []string{"GPU-a-0"}}}}
	plan := Schedule(s)
	if len(plan.Placements) != 0 || len(plan.Preemptions) != 0 || plan.Waiting["g"] != gangTeamsText {
		t.Fatalf("plan = %+v, want the gang waiting: %q", plan, gangTeamsText)
	}
}
