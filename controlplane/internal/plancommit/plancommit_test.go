package plancommit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fixture is a store with nodes of the given capability versions (fencing
// token 7 each) and the given runs.
func fixture(t *testing.T, versions map[string]int, runs ...store.Run) store.Store {
	t.Helper()
	st := memstore.New()
	if err := st.Update(context.Background(), func(tx store.Tx) error {
		for id, v := range versions {
			if err := tx.PutNode(store.Node{ID: id, CreatedAt: t0, EnrolledAt: &t0, FencingToken: 7,
				Facts: &nodeproto.NodeFacts{CPUs: 8, MemoryBytes: 8 << 30, CapabilityVersion: v}}); err != nil {
				return err
			}
		}
		for _, r := range runs {
			if err := tx.CreateRun(r); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return st
}

func queued(id string, nodes int) store.Run {
	return store.Run{Run: api.Run{ID: id, Status: api.RunQueued, CreatedAt: t0, UpdatedAt: t0,
		RunSpec: api.RunSpec{Image: "reg/app:1", CPU: 1, MemoryBytes: 1 << 30, Nodes: nodes}, PinnedImage: "reg/app@sha256:" + strings.Repeat("ab", 32)}}
}

// apply runs Apply in one transaction and returns its answer and the
// operations it created.
func apply(t *testing.T, st store.Store, placements []scheduler.Placement, pending map[string]store.Run) (int, map[string]string, []store.Operation) {
	t.Helper()
	var placed int
	var tooOld map[string]string
	var ops []store.Operation
	n := 0
	newOp := func(nodeID string, fence uint64, cmd nodeproto.Command) store.Operation {
		n++
		cmd.OperationID, cmd.FencingToken = "op-"+string(rune('a'+n)), fence
		op := store.Operation{ID: cmd.OperationID, NodeID: nodeID, CreatedAt: t0, Command: cmd}
		ops = append(ops, op)
		return op
	}
	if err := st.Update(context.Background(), func(tx store.Tx) error {
		var err error
		placed, tooOld, err = Apply(tx, placements, NodeIDs(placements), pending, func() time.Time { return t0 }, newOp)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return placed, tooOld, ops
}

func getRun(t *testing.T, st store.Store, id string) store.Run {
	t.Helper()
	var r store.Run
	if err := st.View(context.Background(), func(tx store.Tx) (err error) { r, err = tx.GetRun(id); return err }); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestApplyPlacesOnlyRunsAsThePlanSawThem: a queued run unchanged since the
// snapshot gets its attempt and its launch under the node's fencing token;
// a cancelled run, and one whose attempts changed since, are left alone.
func TestApplyPlacesOnlyRunsAsThePlanSawThem(t *testing.T) {
	a, b, c := queued("a", 0), queued("b", 0), queued("c", 0)
	b.Cancel = true
	st := fixture(t, map[string]int{"n": nodeproto.Version}, a, b, c)
	stale := c
	stale.Attempts = []api.Attempt{{Number: 1, NodeID: "n"}} // the plan saw an attempt the store no longer has
	pending := map[string]store.Run{"a": a, "b": b, "c": stale}
	plan := []scheduler.Placement{{RunID: "a", NodeID: "n"}, {RunID: "b", NodeID: "n"}, {RunID: "c", NodeID: "n"}}
	placed, tooOld, ops := apply(t, st, plan, pending)
	if placed != 1 || len(tooOld) != 0 || len(ops) != 1 {
		t.Fatalf("placed %d, tooOld %v, %d operations; want 1, none, 1", placed, tooOld, len(ops))
	}
	if op := ops[0]; op.Command.Kind != nodeproto.KindLaunchWorkload || op.Command.FencingToken != 7 || op.Command.LaunchWorkload.RunID != "a" {
		t.Fatalf("operation = %+v, want run a's launch under fencing token 7", op.Command)
	}
	if r := getRun(t, st, "a"); r.Status != api.RunPlaced || len(r.Attempts) != 1 || r.Attempts[0].NodeID != "n" {
		t.Fatalf("run a = %s with attempts %+v, want placed on n", r.Status, r.Attempts)
	}
	for _, id := range []string{"b", "c"} {
		if r := getRun(t, st, id); r.Status != api.RunQueued || len(r.Attempts) != 0 {
			t.Fatalf("run %s = %s with %d attempts, want untouched", id, r.Status, len(r.Attempts))
		}
	}
}

// TestGangCommitsWholeOrNotAtAll: a gang whose plan lacks a member, or one
// of whose members' agent is too old for a gang's launch, is not placed and
// says why; a whole plan places every member, each with its launch.
func TestGangCommitsWholeOrNotAtAll(t *testing.T) {
	g := queued("g", 2)
	g.Network = api.NetworkHost // a gang's launch on the host's network needs nodeproto.VersionGang
	st := fixture(t, map[string]int{"n1": nodeproto.Version, "n2": nodeproto.Version, "old": nodeproto.VersionUpgrade}, g)
	pending := map[string]store.Run{"g": g}
	for _, plan := range [][]scheduler.Placement{
		{{RunID: "g", NodeID: "n1"}},
		{{RunID: "g", NodeID: "n1"}, {RunID: "g", NodeID: "old", Rank: 1}},
	} {
		placed, tooOld, ops := apply(t, st, plan, pending)
		if placed != 0 || !strings.HasPrefix(tooOld["g"], "waiting: ") || len(ops) != 0 {
			t.Fatalf("plan %v: placed %d, tooOld %v, %d operations; want none placed, a reason", plan, placed, tooOld, len(ops))
		}
	}
	placed, _, ops := apply(t, st, []scheduler.Placement{{RunID: "g", NodeID: "n1"}, {RunID: "g", NodeID: "n2", Rank: 1}}, pending)
	if placed != 1 || len(ops) != 2 || ops[0].NodeID != "n1" || ops[1].NodeID != "n2" {
		t.Fatalf("placed %d with operations %+v, want one gang, a launch on n1 and on n2", placed, ops)
	}
	if r := getRun(t, st, "g"); r.Status != api.RunPlaced || len(r.Attempts) != 2 {
		t.Fatalf("gang = %s with %d attempts, want placed with 2", r.Status, len(r.Attempts))
	}
}

// TestReasonDue: a scheduler's reason replaces one it did not give at
// once, and one it gave only once ReasonRefresh has passed.
func TestReasonDue(t *testing.T) {
	r := queued("a", 0)
	why := SchedulerReason + "3 nodes have too little free memory"
	if !ReasonDue(r, why, t0) {
		t.Fatal("a run with no reason should take the scheduler's")
	}
	r.Reason = SchedulerReason + "2 nodes have too little free memory"
	if ReasonDue(r, r.Reason, t0.Add(time.Hour)) || ReasonDue(r, why, t0.Add(ReasonRefresh-time.Second)) || !ReasonDue(r, why, t0.Add(ReasonRefresh)) {
		t.Fatal("a scheduler's reason should stand until ReasonRefresh passes, and the same one never be rewritten")
	}
}
