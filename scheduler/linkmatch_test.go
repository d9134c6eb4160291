package scheduler

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

// TestMatchingLinksIsClosest: over random readings, the chosen members'
// spread (fastest over slowest, every spread up to linkMatchRatio counted
// as equal) is the smallest of every way to choose them, found by trying
// them all; the positions come back ascending and distinct.
func TestMatchingLinksIsClosest(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	tiers := []int64{100e6, 1e9, 1.1e9, 1.3e9, 3e9, 10e9, 10.2e9, 12.6e9}
	spread := func(floors []int64, set []int) float64 {
		lo, hi := floors[set[0]], floors[set[0]]
		for _, p := range set {
			lo, hi = min(lo, floors[p]), max(hi, floors[p])
		}
		return max(float64(hi)/float64(lo), linkMatchRatio)
	}
	for trial := 0; trial < 3000; trial++ {
		c := 1 + rng.Intn(9)
		n := 1 + rng.Intn(c)
		floors := make([]int64, c)
		for i := range floors {
			floors[i] = tiers[rng.Intn(len(tiers))]
		}
		got := matchingLinks(floors, n)
		if len(got) != n || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != n {
			t.Fatalf("floors %v, n %d: positions %v", floors, n, got)
		}
		best := spread(floors, got)
		for mask := 0; mask < 1<<c; mask++ {
			var set []int
			for p := 0; p < c; p++ {
				if mask&(1<<p) != 0 {
					set = append(set, p)
				}
			}
			if len(set) == n && spread(floors, set) < best {
				t.Fatalf("floors %v, n %d: chose %v (spread %.2f), but %v spreads %.2f", floors, n, got, best, set, spread(floors, set))
			}
		}
	}
}

// linkNode is an idle 8×H100 machine whose artifact-copy floor is bps (0:
// it has measured none).
func linkNode(id string, bps int64) Node {
	n := Node{ID: id, Ready: true, CPU: 64, MemoryBytes: 512 * gib, LinkFloorBPS: bps}
	for k := range 8 {
		n.GPUs = append(n.GPUs, GPU{UUID: fmt.Sprintf("GPU-%s-%d", id, k), Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 * gib})
	}
	return n
}

// gangNodes is the nodes of run id's members in the plan, by rank.
func gangNodes(p Plan, id string) []string {
	var out []string
	for _, pl := range p.Placements {
		if pl.RunID == id {
			out = append(out, pl.NodeID)
		}
	}
	return out
}

// TestGangPrefersMatchingLinks: the single-run policy alone would put a
// gang of 2 on the first two machines, a slow one (100 MB/s) and a fast
// one (10 GB/s); the gang goes on two fast ones instead, ranked in the
// policy's order, and the slow machine is left to the single run behind
// it. Where a node's readings are alike the policy's choice stands.
func TestGangPrefersMatchingLinks(t *testing.T) {
	s := Snapshot{Nodes: []Node{linkNode("a-slow", 100e6), linkNode("b-fast", 10e9), linkNode("c-fast", 10.4e9), linkNode("d-fast", 9.9e9)},
		Pending: []Run{{ID: "gang", GPUs: 8, GPUModel: "H100", Nodes: 2}, {ID: "single", GPUs: 8, GPUModel: "H100"}}}
	p := Schedule(s)
	if got := gangNodes(p, "gang"); !slices.Equal(got, []string{"b-fast", "c-fast"}) {
		t.Fatalf("gang on %v, want b-fast and c-fast (placements %+v)", got, p.Placements)
	}
	if got := gangNodes(p, "single"); !slices.Equal(got, []string{"a-slow"}) {
		t.Fatalf("the single run on %v, want the slow machine the gang left", got)
	}

	// A gang of 3 over two slow machines and two fast ones: the two slow
	// ones cannot hold it, so it takes the three that match: the fast ones.
	s.Nodes = []Node{linkNode("a-slow", 100e6), linkNode("b-fast", 10e9), linkNode("c-slow", 110e6), linkNode("d-fast", 10e9), linkNode("e-fast", 11e9)}
	s.Pending = []Run{{ID: "gang", GPUs: 8, GPUModel: "H100", Nodes: 3}}
	if got := gangNodes(Schedule(s), "gang"); !slices.Equal(got, []string{"b-fast", "d-fast", "e-fast"}) {
		t.Fatalf("gang of 3 on %v, want the three fast machines", got)
	}

	// Readings within linkMatchRatio of each other match: the policy's
	// first two stand, though b-fast and c-fast are closer still.
	s.Nodes = []Node{linkNode("a-fast", 10.4e9), linkNode("b-fast", 10e9), linkNode("c-fast", 9.9e9)}
	s.Pending = []Run{{ID: "gang", GPUs: 8, GPUModel: "H100", Nodes: 2}}
	if got := gangNodes(Schedule(s), "gang"); !slices.Equal(got, []string{"a-fast", "b-fast"}) {
		t.Fatalf("gang on %v, want the policy's a-fast and b-fast", got)
	}
}

// TestGangUnmeasuredLinksReadAssumed: a node that has measured nothing
// reads the fleet's assumption (1 GB/s), so it matches a node measured at
// 1 GB/s and not one at 10 GB/s; of two matching pairs the one the policy
// ranks higher wins.
func TestGangUnmeasuredLinksReadAssumed(t *testing.T) {
	s := Snapshot{Nodes: []Node{linkNode("a-unmeasured", 0), linkNode("b-fast", 10e9), linkNode("c-measured1g", AssumedLinkBytesPerSecond), linkNode("d-fast", 10e9)},
		Pending: []Run{{ID: "gang", GPUs: 8, GPUModel: "H100", Nodes: 2}}}
	if got := gangNodes(Schedule(s), "gang"); !slices.Equal(got, []string{"a-unmeasured", "c-measured1g"}) {
		t.Fatalf("gang on %v, want the unmeasured node beside the one measured at the assumed 1 GB/s", got)
	}
}

// TestPropertyGangsWholeOrNotWithLinks is TestPropertyGangsWholeOrNot on
// fleets whose nodes have link readings, from a few tiers (and some none):
// still whole or not at all, within capacity, and the reference's plan,
// whose gangs pick matching links by the definition.
func TestPropertyGangsWholeOrNotWithLinks(t *testing.T) {
	tiers := []int64{0, 100e6, 1e9, 1.2e9, 10e9, 11e9, 40e9}
	checkGangTrials(t, 28, func(rng *rand.Rand, nodes []Node) {
		for i := range nodes {
			nodes[i].LinkFloorBPS = tiers[rng.Intn(len(tiers))]
		}
	})
}
