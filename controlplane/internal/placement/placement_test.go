package placement

import (
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/schedcopy"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// TestReserveFunctionShare: the scheduler counts a node's function share
// as used.
func TestReserveFunctionShare(t *testing.T) {
	sn := scheduler.Node{ID: "n", CPU: 8, MemoryBytes: 32 << 30, UsedGPUs: map[string]bool{}}
	reserveFunctionShare(&sn, &nodeproto.NodeFacts{Functions: &nodeproto.FunctionCapacity{MemoryBytes: 8 << 30, MilliCPUs: 2000, GPUs: []string{"GPU-1"}}})
	if sn.UsedMemory != 8<<30 || sn.UsedCPU != 2 || !sn.UsedGPUs["GPU-1"] {
		t.Errorf("node after the share = %+v", sn)
	}
	reserveFunctionShare(&sn, &nodeproto.NodeFacts{})
	if sn.UsedMemory != 8<<30 {
		t.Errorf("a node without functions reserved %d", sn.UsedMemory-8<<30)
	}
}

// TestSnapshotLeavesTheViewAlone: the view a pass starts from is kept
// between passes, so the GPUs active attempts hold are added to a copy,
// never to the view's function share.
func TestSnapshotLeavesTheViewAlone(t *testing.T) {
	n := Node(store.Node{ID: "n", Facts: &nodeproto.NodeFacts{CPUs: 8, MemoryBytes: 32 << 30,
		Functions: &nodeproto.FunctionCapacity{GPUs: []string{"GPU-0"}}}}, api.NodeReady, time.Now())
	view, index := []scheduler.Node{n}, map[string]int{"n": 0}
	each := func(fn func(schedcopy.Usage)) {
		fn(schedcopy.Usage{CPU: 2, Mem: 1 << 30, Attempts: []schedcopy.Attempt{{Node: "n", GPUs: []string{"GPU-1"}}, {Node: "gone"}}})
	}
	queued := []store.Run{{Run: api.Run{ID: "new"}}, {Run: api.Run{ID: "cancelled", Cancel: true}}, {Run: api.Run{ID: "old"}}}
	snap, pending := Snapshot(view, index, each, queued)
	got := snap.Nodes[0]
	if got.UsedCPU != 2 || got.UsedMemory != 1<<30 || !got.UsedGPUs["GPU-0"] || !got.UsedGPUs["GPU-1"] {
		t.Errorf("node in the snapshot = %+v", got)
	}
	if view[0].UsedCPU != 0 || view[0].UsedGPUs["GPU-1"] || !view[0].UsedGPUs["GPU-0"] {
		t.Errorf("the view changed: %+v", view[0])
	}
	if len(snap.Pending) != 2 || snap.Pending[0].ID != "old" || snap.Pending[1].ID != "new" || len(pending) != 2 {
		t.Errorf("pending %+v (by ID %d); want old, new: oldest first, the cancelled run left out", snap.Pending, len(pending))
	}
}

// TestTooOld: a command newer than the node's agent makes the run wait,
// saying which node, which version and what to do.
func TestTooOld(t *testing.T) {
	run := store.Run{Run: api.Run{ID: "r", RunSpec: api.RunSpec{Artifacts: []api.ArtifactMount{{Name: "a", Version: "1"}}}}}
	need := AgentVersion(run)
	prep := nodeproto.Command{Kind: nodeproto.KindPrepareArtifact}
	if why := TooOld("n", need, []nodeproto.Command{prep, Launch(run, 1, nil)}); why != "" {
		t.Errorf("an agent of version %d refused: %s", need, why)
	}
	if why := TooOld("n", need-1, []nodeproto.Command{prep, Launch(run, 1, nil)}); !strings.Contains(why, "node n") || !strings.Contains(why, "upgrade the agent") {
		t.Errorf("an agent of version %d: %q", need-1, why)
	}
	if why := TooOld("n", 0, nil); why != "" {
		t.Errorf("nothing to send to an agent without facts: %q", why)
	}
}
