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
func TestPropertyGangsWholeOrNot(t *testing.T) { checkGangTrials(t, 18, nil) }

// checkGangTrials is TestPropertyGangsWholeOrNot's trials, each fleet
// changed by adjust when it is not nil (linkmatch_test.go gives the nodes
// link readings).
func checkGangTrials(t *testing.T, seed int64, adjust func(*rand.Rand, []Node)) {
	rng := rand.New(rand.NewSource(seed))
	images := []string{"", "a@sha256:1", "b@sha256:2"}
	trials := 2000
	if testing.Short() {
		trials = 500
	}
	for trial := 0; trial < trials; trial++ {
		s := Snapshot{Nodes: randomFleet(rng, images, false), Pending: withGangs(rng, randomRuns(rng, images, rng.Intn(60)))}
		if adjust != nil {
			adjust(rng, s.Nodes)
		}
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

// TestGangUnderProjects: with projects planning the fleet, a gang is
// placed whole, charged to its project as all its members, borrows idle
// capacity beyond its quota like any run, waits saying why when the fleet
// lacks the nodes (nothing preempted for it), and counts once against its
// project's cap.
func TestGangUnderProjects(t *testing.T) {
	node := func(id string) Node {
		n := Node{ID: id, Ready: true, CPU: 64, MemoryBytes: 512 * gib}
		for k := range 8 {
			n.GPUs = append(n.GPUs, GPU{UUID: fmt.Sprintf("GPU-%s-%d", id, k), Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 * gib})
		}
		return n
	}
	gang := Run{ID: "g", GPUs: 8, GPUModel: "H100", Nodes: 2, Project: "p"}
	within := Snapshot{Nodes: []Node{node("a"), node("b")}, Pending: []Run{gang},
		Projects: []Project{{Name: "p", GPUs: map[string]int{"H100": 16}}, {Name: "q", GPUs: map[string]int{"H100": 8}}}}
	plan := Schedule(within)
	if len(plan.Placements) != 2 || plan.Placements[0].NodeID == plan.Placements[1].NodeID ||
		plan.Placements[0].Rank != 0 || plan.Placements[1].Rank != 1 {
		t.Fatalf("within its quota: placements %+v, want the gang's two ranks on a and b", plan.Placements)
	}

	// Over its quota (q has 8 H100) on an idle fleet: borrowed.
	over := within
	over.Pending = []Run{{ID: "g", GPUs: 8, GPUModel: "H100", Nodes: 2, Project: "q"}}
	if plan := Schedule(over); len(plan.Placements) != 2 {
		t.Fatalf("over its quota on an idle fleet: placements %+v, want the gang borrowing both nodes", plan.Placements)
	}

	// One card of a taken by lower-priority work of its own project: the
	// gang would pass the quota and the fleet has too little free to lend,
	// so it waits saying so, and nothing is preempted for it.
	busy := within
	busy.Nodes = []Node{node("a"), node("b")}
	busy.Nodes[0].UsedGPUs = map[string]bool{"GPU-a-0": true}
	busy.Running = []Running{{RunID: "low", NodeID: "a", Project: "p", Priority: -5, GPUs: []string{"GPU-a-0"}}}
	plan = Schedule(busy)
	if len(plan.Placements) != 0 || len(plan.Preemptions) != 0 || plan.Waiting["g"] != "waiting: project p is at its quota of 16 H100 (1 in use, 15 borrowable)" {
		t.Fatalf("one card short: plan %+v, want the gang waiting at its quota", plan)
	}

	// The same card taken by another project's work, p's quota large
	// enough: the gang waits for nodes.
	short := busy
	short.Projects = []Project{{Name: "p", GPUs: map[string]int{"H100": 32}}, {Name: "q", GPUs: map[string]int{"H100": 8}}}
	short.Running = []Running{{RunID: "other", NodeID: "a", Project: "q", GPUs: []string{"GPU-a-0"}}}
	if why := Schedule(short).Waiting["g"]; why != "waiting: gang of 2: need 2 nodes with 8 free H100 GPUs; 1 has" {
		t.Fatalf("one node short: the gang waits %q", why)
	}

	// A cap of one running run, with one running: the gang waits for the cap.
	capped := within
	capped.Projects = []Project{{Name: "p", GPUs: map[string]int{"H100": 16}, MaxRunning: 1}}
	capped.Running = []Running{{RunID: "cpu", NodeID: "a", Project: "p", CPU: 1}}
	if why := Schedule(capped).Waiting["g"]; why != "waiting: project p is at its cap of 1 running runs" {
		t.Fatalf("at its cap: the gang waits %q", why)
	}
}
