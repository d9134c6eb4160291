package scheduler

import (
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// randomFleet is a small fleet that exercises every predicate and every
// tie: nodes not ready (some sharing a reason, one whose reason reads like
// another predicate's), cordoned, without facts, duplicate IDs, mixed and
// uniform GPU shapes, GPUs already held, images held, and now and then a
// machine with more GPUs than a mask bit can count. Node IDs repeat only when
// duplicateIDs is set: a control plane never sends that, but it is the tie
// the policy breaks by snapshot order, so the equivalence test wants it.
func randomFleet(rng *rand.Rand, images []string, duplicateIDs bool) []Node {
	models := []struct {
		name string
		mem  int64
	}{{"NVIDIA H100 80GB HBM3", 80 * gib}, {"NVIDIA A100-SXM4-40GB", 40 * gib}, {"NVIDIA L4", 22 * gib}, {"NVIDIA H200", 141 * gib}}
	var nodes []Node
	for i := 0; i < rng.Intn(40); i++ {
		id := fmt.Sprintf("n%02d", i)
		if duplicateIDs {
			id = fmt.Sprintf("n%02d", rng.Intn(60))
		}
		n := Node{ID: id, Ready: rng.Intn(8) > 0, CPU: float64(rng.Intn(5) * 4), MemoryBytes: int64(rng.Intn(5)) * 16 * gib}
		if rng.Intn(4) == 0 {
			n.CPU += 0.5
		}
		if !n.Ready {
			n.NotReadyReason = []string{"", "is unreachable", "has not enrolled yet", "has too little free CPU (need 1)"}[rng.Intn(4)]
		}
		n.Cordoned = rng.Intn(10) == 0
		count := []int{0, 0, 1, 2, 4, 8, 8}[rng.Intn(7)]
		uniform := rng.Intn(3) > 0
		if rng.Intn(12) == 0 {
			count, uniform = []int{64, 66, 70}[rng.Intn(3)], true
		}
		m := models[rng.Intn(len(models))]
		for k := 0; k < count; k++ {
			if !uniform {
				m = models[rng.Intn(len(models))]
			}
			n.GPUs = append(n.GPUs, GPU{UUID: fmt.Sprintf("GPU-%s-%d-%d", id, i, k), Model: m.name, MemoryBytes: m.mem, Disputed: rng.Intn(10) == 0})
		}
		if len(n.GPUs) > 0 && rng.Intn(8) == 0 { // a node listing one device twice
			n.GPUs = append(n.GPUs, n.GPUs[rng.Intn(len(n.GPUs))])
		}
		n.UsedCPU = float64(rng.Intn(3))
		n.UsedMemory = int64(rng.Intn(3)) * 8 * gib
		n.UsedGPUs = map[string]bool{}
		for _, g := range n.GPUs {
			if rng.Intn(4) == 0 {
				n.UsedGPUs[g.UUID] = rng.Intn(5) > 0
			}
		}
		n.Images = map[string]bool{}
		for _, img := range images {
			if rng.Intn(3) == 0 {
				n.Images[img] = rng.Intn(6) > 0
			}
		}
		nodes = append(nodes, n)
	}
	return nodes
}

func randomRuns(rng *rand.Rand, images []string, count int) []Run {
	var runs []Run
	for i := 0; i < count; i++ {
		r := Run{ID: fmt.Sprint("r", i), Image: images[rng.Intn(len(images))], CPU: float64(rng.Intn(5)), MemoryBytes: int64(rng.Intn(5)) * 4 * gib}
		if rng.Intn(5) == 0 {
			r.CPU = 0.25 * float64(rng.Intn(8))
		}
		switch rng.Intn(3) {
		case 0:
			r.GPUs = []int{1, 1, 2, 3, 4, 8, 9, 65}[rng.Intn(8)]
			r.GPUModel = []string{"", "", "h100", "A100", "nvidia", "l4", "H20", "mi300"}[rng.Intn(8)]
			r.GPUMemory = []int64{0, 0, 0, 40 * gib, 80 * gib}[rng.Intn(5)]
		}
		runs = append(runs, r)
	}
	return runs
}

// TestPropertySameAsReference holds Schedule to the policy exactly: over
// random fleets and queues, its plan (placements, devices, and every waiting
// reason word for word) is the one the original scan of every node for every
// run produces.
func TestPropertySameAsReference(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	images := []string{"", "a@sha256:1", "b@sha256:2", "c@sha256:3"}
	trials := 3000
	if testing.Short() {
		trials = 1000
	}
	for trial := 0; trial < trials; trial++ {
		s := Snapshot{Nodes: randomFleet(rng, images, true), Pending: randomRuns(rng, images, rng.Intn(60))}
		got, want := Schedule(s), referenceSchedule(s)
		if !reflect.DeepEqual(got, want) {
			for i := range max(len(got.Placements), len(want.Placements)) {
				var g, w Placement
				if i < len(got.Placements) {
					g = got.Placements[i]
				}
				if i < len(want.Placements) {
					w = want.Placements[i]
				}
				if !reflect.DeepEqual(g, w) {
					t.Fatalf("trial %d: placement %d = %+v, reference %+v", trial, i, g, w)
				}
			}
			for id, why := range want.Waiting {
				if got.Waiting[id] != why {
					t.Fatalf("trial %d: run %s waits with %q, reference %q", trial, id, got.Waiting[id], why)
				}
			}
			t.Fatalf("trial %d: plans differ:\n got %+v\nwant %+v", trial, got, want)
		}
	}
}

// TestPropertyWaitingRunsFitNowhere replays each plan in order with a
// capacity model written independently of the scheduler, and checks that a
// run left waiting could not have been placed on any node given the
// placements before it, and that every placement fitted where it went.
func TestPropertyWaitingRunsFitNowhere(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	images := []string{"", "a@sha256:1"}
	for trial := 0; trial < 1000; trial++ {
		s := Snapshot{Nodes: randomFleet(rng, images, false), Pending: randomRuns(rng, images, rng.Intn(80))}
		plan := Schedule(s)
		type capacity struct {
			cpu  float64
			mem  int64
			used map[string]bool
		}
		left := map[int]*capacity{}
		for i, n := range s.Nodes {
			c := &capacity{cpu: n.CPU - n.UsedCPU, mem: n.MemoryBytes - n.UsedMemory, used: map[string]bool{}}
			for u, held := range n.UsedGPUs {
				c.used[u] = held
			}
			left[i] = c
		}
		// freeMatching lists the GPUs of node i that the run accepts and
		// nobody holds.
		freeMatching := func(i int, r Run) []string {
			var free []string
			seen := map[string]bool{}
			for _, g := range s.Nodes[i].GPUs {
				if g.Disputed || seen[g.UUID] {
					continue
				}
				seen[g.UUID] = true
				if (r.GPUModel == "" || strings.Contains(strings.ToLower(g.Model), strings.ToLower(r.GPUModel))) &&
					(r.GPUMemory == 0 || g.MemoryBytes >= r.GPUMemory) && !left[i].used[g.UUID] {
					free = append(free, g.UUID)
				}
			}
			return free
		}
		takes := func(i int, r Run) bool {
			n := s.Nodes[i]
			return n.Ready && !n.Cordoned && n.CPU > 0 && n.MemoryBytes > 0 && r.CPU <= n.CPU && r.MemoryBytes <= n.MemoryBytes &&
				r.CPU <= left[i].cpu+1e-9 && r.MemoryBytes <= left[i].mem && len(freeMatching(i, r)) >= r.GPUs
		}
		byRun := map[string]Placement{}
		for _, p := range plan.Placements {
			byRun[p.RunID] = p
		}
		for _, r := range s.Pending {
			p, placed := byRun[r.ID]
			if !placed {
				for i := range s.Nodes {
					if takes(i, r) {
						t.Fatalf("trial %d: run %+v waits (%q) but node %s could take it", trial, r, plan.Waiting[r.ID], s.Nodes[i].ID)
					}
				}
				continue
			}
			target := -1
			for i, n := range s.Nodes {
				if n.ID == p.NodeID {
					target = i
				}
			}
			if target < 0 || !takes(target, r) || len(p.GPUs) != r.GPUs || !containsAll(freeMatching(target, r), p.GPUs) {
				t.Fatalf("trial %d: run %+v placed on %s with %v, which could not take it", trial, r, p.NodeID, p.GPUs)
			}
			left[target].cpu -= r.CPU
			left[target].mem -= r.MemoryBytes
			for _, g := range p.GPUs {
				left[target].used[g] = true
			}
		}
	}
}

func containsAll(set, items []string) bool {
	in := map[string]bool{}
	for _, s := range set {
		in[s] = true
	}
	for _, s := range items {
		if !in[s] {
			return false
		}
	}
	return true
}

// TestPropertySameAsReferenceOnLargeMachines is the equivalence test for
// machines with more GPUs than the index's free-count mask tells apart (63
// and up), where it must compare the counts itself.
func TestPropertySameAsReferenceOnLargeMachines(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	for trial := 0; trial < 500; trial++ {
		var nodes []Node
		for i := 0; i < 2+rng.Intn(6); i++ {
			n := Node{ID: fmt.Sprintf("big%d", rng.Intn(8)), Ready: true, CPU: 256, MemoryBytes: 4096 * gib, UsedGPUs: map[string]bool{}}
			count := 56 + rng.Intn(20)
			for k := 0; k < count; k++ {
				uuid := fmt.Sprintf("GPU-%d-%d", i, k)
				n.GPUs = append(n.GPUs, GPU{UUID: uuid, Model: "NVIDIA H100", MemoryBytes: 80 * gib})
				n.UsedGPUs[uuid] = rng.Intn(8) == 0
			}
			nodes = append(nodes, n)
		}
		var runs []Run
		for i := 0; i < rng.Intn(12); i++ {
			runs = append(runs, Run{ID: fmt.Sprint("r", i), GPUs: []int{1, 8, 40, 62, 63, 64, 65}[rng.Intn(7)], CPU: 1})
		}
		s := Snapshot{Nodes: nodes, Pending: runs}
		if got, want := Schedule(s), referenceSchedule(s); !reflect.DeepEqual(got, want) {
			t.Fatalf("trial %d: plans differ:\n got %+v\nwant %+v", trial, got, want)
		}
	}
}
