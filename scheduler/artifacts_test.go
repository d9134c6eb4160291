package scheduler

import (
	"strings"
	"testing"
)

const (
	dataset = "d0000000000000000000000000000000000000000000000000000000000000d0"
	weights = "e0000000000000000000000000000000000000000000000000000000000000e0"
)

func holding(n Node, digests ...string) Node {
	n.Artifacts = map[string]bool{}
	for _, d := range digests {
		n.Artifacts[d] = true
	}
	return n
}

func TestPrefersNodeHoldingEveryArtifact(t *testing.T) {
	roomy := cpuNode("a-roomy", 8, 64*gib)
	some := holding(cpuNode("b-some", 4, 8*gib), dataset)
	all := holding(cpuNode("c-all", 4, 8*gib), dataset, weights)
	run := Run{ID: "r", Image: "img@sha256:x", CPU: 1, Artifacts: []string{weights, dataset}}
	p := Schedule(Snapshot{Nodes: []Node{roomy, some, all}, Pending: []Run{run}})
	if len(p.Placements) != 1 || p.Placements[0].NodeID != "c-all" {
		t.Fatalf("placements = %+v, want on c-all (holds both artifacts)", p.Placements)
	}
	// Holding some is not preferred: the roomiest node wins as for any run.
	p = Schedule(Snapshot{Nodes: []Node{roomy, some}, Pending: []Run{run}})
	if len(p.Placements) != 1 || p.Placements[0].NodeID != "a-roomy" {
		t.Fatalf("placements = %+v, want on a-roomy (no node holds both)", p.Placements)
	}
}

func TestArtifactsBeforeImage(t *testing.T) {
	img := cpuNode("a-image", 4, 8*gib)
	img.Images = map[string]bool{"img@sha256:x": true}
	art := holding(cpuNode("b-artifact", 4, 8*gib), dataset)
	both := holding(cpuNode("c-both", 4, 4*gib), dataset)
	both.Images = map[string]bool{"img@sha256:x": true}
	run := Run{ID: "r", Image: "img@sha256:x", CPU: 1, Artifacts: []string{dataset}}
	p := Schedule(Snapshot{Nodes: []Node{img, art, both}, Pending: []Run{run}})
	if p.Placements[0].NodeID != "c-both" {
		t.Fatalf("placed on %s, want c-both (artifact and image)", p.Placements[0].NodeID)
	}
	p = Schedule(Snapshot{Nodes: []Node{img, art}, Pending: []Run{run}})
	if p.Placements[0].NodeID != "b-artifact" {
		t.Fatalf("placed on %s, want b-artifact (artifact beats image)", p.Placements[0].NodeID)
	}
	// A full holder is passed over for a node that fits.
	full := holding(cpuNode("b-artifact", 1, 8*gib), dataset)
	full.UsedCPU = 1
	p = Schedule(Snapshot{Nodes: []Node{img, full}, Pending: []Run{run}})
	if len(p.Placements) != 1 || p.Placements[0].NodeID != "a-image" {
		t.Fatalf("placements = %+v, want on a-image (the holder is full)", p.Placements)
	}
}

func TestHonoursLinkFloor(t *testing.T) {
	slow := cpuNode("a-slow", 8, 64*gib)
	slow.LinkFloorBPS = 100_000_000
	assumed := cpuNode("b-assumed", 4, 8*gib)
	assumed.LinkFloorBPS = AssumedLinkBytesPerSecond
	run := Run{ID: "r", CPU: 1, Artifacts: []string{dataset}, MinReadBPS: 500_000_000}
	p := Schedule(Snapshot{Nodes: []Node{slow, assumed}, Pending: []Run{run}})
	if len(p.Placements) != 1 || p.Placements[0].NodeID != "b-assumed" {
		t.Fatalf("placements = %+v, want on b-assumed (a-slow is below the floor)", p.Placements)
	}
	// Holding the content does not excuse a slow node.
	slowHolder := holding(slow, dataset)
	p = Schedule(Snapshot{Nodes: []Node{slowHolder}, Pending: []Run{run, {ID: "plain", CPU: 1}}})
	if len(p.Placements) != 1 || p.Placements[0].RunID != "plain" {
		t.Fatalf("placements = %+v, want only the run without a floor", p.Placements)
	}
	want := "waiting: 1 node has an artifact-copy floor below the run's (need 500.0 MB/s)"
	if p.Waiting["r"] != want {
		t.Fatalf("reason = %q, want %q", p.Waiting["r"], want)
	}
	// Two slow nodes and a GPU run: the floor is checked for GPU runs too,
	// and counted per node.
	g1, g2 := gpuNode("g1", 8, "H100"), gpuNode("g2", 8, "H100")
	g1.LinkFloorBPS, g2.LinkFloorBPS = 1, 2
	p = Schedule(Snapshot{Nodes: []Node{g1, g2}, Pending: []Run{{ID: "gr", GPUs: 1, MinReadBPS: 3}}})
	if len(p.Placements) != 0 || !strings.Contains(p.Waiting["gr"], "2 nodes have an artifact-copy floor below the run's (need 3 B/s)") {
		t.Fatalf("placements %+v, reason %q", p.Placements, p.Waiting["gr"])
	}
	g2.LinkFloorBPS = 3
	p = Schedule(Snapshot{Nodes: []Node{g1, g2}, Pending: []Run{{ID: "gr", GPUs: 1, MinReadBPS: 3}}})
	if len(p.Placements) != 1 || p.Placements[0].NodeID != "g2" {
		t.Fatalf("placements %+v, want on g2 (meets the floor exactly)", p.Placements)
	}
}

func TestRate(t *testing.T) {
	for bps, want := range map[int64]string{999: "999 B/s", 1000: "1.0 kB/s", 500_000_000: "500.0 MB/s", 2_500_000_000: "2.5 GB/s"} {
		if got := Rate(bps); got != want {
			t.Errorf("Rate(%d) = %q, want %q", bps, got, want)
		}
	}
}
