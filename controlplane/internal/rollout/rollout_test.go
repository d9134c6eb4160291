package rollout

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func newRollout(n, canary, parallel int) store.Rollout {
	r := store.Rollout{ID: "r", Version: "v2", Canary: canary, MaxParallel: parallel, Deadline: time.Minute, State: store.RolloutRunning}
	for i := range n {
		r.Nodes = append(r.Nodes, store.RolloutNode{ID: fmt.Sprintf("n%d", i), State: store.RolloutNodePending})
	}
	return r
}

func fleet(r store.Rollout, version string) map[string]Node {
	m := map[string]Node{}
	for _, rn := range r.Nodes {
		m[rn.ID] = Node{Ready: true, Version: version, Capability: nodeproto.VersionUpgrade}
	}
	return m
}

var ok = &nodeproto.Result{Outcome: nodeproto.OutcomeOK}

// TestCanariesFirstThenParallel: the canaries alone, then the rest at
// most MaxParallel in flight, then done.
func TestCanariesFirstThenParallel(t *testing.T) {
	r := newRollout(7, 2, 3)
	nodes := fleet(r, "v1")
	r, send := Step(r, nodes, t0)
	if !slices.Equal(send, []string{"n0", "n1"}) {
		t.Fatalf("first step sends %v, want the two canaries", send)
	}
	// One canary back: still nothing else goes.
	nodes["n0"] = Node{Ready: true, Version: "v2", Result: ok}
	r, send = Step(r, nodes, t0.Add(time.Second))
	if len(send) != 0 || r.Nodes[0].State != store.RolloutNodeUpgraded {
		t.Fatalf("with one canary back: sends %v, n0 %s", send, r.Nodes[0].State)
	}
	// A canary that answered ok but does not report the new version yet
	// is not upgraded.
	nodes["n1"] = Node{Ready: true, Version: "v1", Result: ok}
	if _, send = Step(r, nodes, t0.Add(2*time.Second)); len(send) != 0 {
		t.Fatalf("canary not reporting v2 yet, but the rest went: %v", send)
	}
	nodes["n1"] = Node{Ready: true, Version: "v2", Result: ok}
	r, send = Step(r, nodes, t0.Add(3*time.Second))
	if !slices.Equal(send, []string{"n2", "n3", "n4"}) {
		t.Fatalf("after the canaries: sends %v, want three (max parallel)", send)
	}
	nodes["n3"] = Node{Ready: true, Version: "v2", Result: ok}
	r, send = Step(r, nodes, t0.Add(4*time.Second))
	if !slices.Equal(send, []string{"n5"}) {
		t.Fatalf("one back of three in flight: sends %v, want n5", send)
	}
	for _, id := range []string{"n2", "n4", "n5"} {
		nodes[id] = Node{Ready: true, Version: "v2", Result: ok}
	}
	r, send = Step(r, nodes, t0.Add(5*time.Second))
	if !slices.Equal(send, []string{"n6"}) || r.State != store.RolloutRunning {
		t.Fatalf("sends %v state %s, want n6 and running", send, r.State)
	}
	nodes["n6"] = Node{Ready: true, Version: "v2", Result: ok}
	if r, _ = Step(r, nodes, t0.Add(6*time.Second)); r.State != store.RolloutSucceeded {
		t.Fatalf("every node back: state %s", r.State)
	}
}

// TestFailureStops: a failed canary stops the rollout; nothing else is
// sent, and the reason names the node and its error.
func TestFailureStops(t *testing.T) {
	r := newRollout(5, 1, 10)
	nodes := fleet(r, "v1")
	r, _ = Step(r, nodes, t0)
	nodes["n0"] = Node{Ready: true, Version: "v1", Result: &nodeproto.Result{Outcome: nodeproto.OutcomeFailed, Error: "rolled back to v1: crashed"}}
	r, send := Step(r, nodes, t0.Add(time.Second))
	if len(send) != 0 || r.State != store.RolloutStopped || !strings.Contains(r.Reason, "n0: rolled back") {
		t.Fatalf("sends %v, state %s, reason %q", send, r.State, r.Reason)
	}
	if r2, send := Step(r, nodes, t0.Add(time.Hour)); len(send) != 0 || r2.State != store.RolloutStopped {
		t.Fatal("a stopped rollout moved on")
	}
}

// TestSilentNodeFailsAtDeadline: a node that never answers fails once the
// deadline and the grace passed, not before.
func TestSilentNodeFailsAtDeadline(t *testing.T) {
	r := newRollout(2, 1, 1)
	nodes := fleet(r, "v1")
	r, _ = Step(r, nodes, t0)
	if r, _ = Step(r, nodes, t0.Add(r.Deadline+Grace)); r.State != store.RolloutRunning {
		t.Fatalf("failed at exactly the deadline: %s", r.Reason)
	}
	if r, _ = Step(r, nodes, t0.Add(r.Deadline+Grace+time.Second)); r.State != store.RolloutStopped {
		t.Fatalf("past the deadline: state %s", r.State)
	}
}

// TestSkipsAndRefusals: a node already at the version is not sent the
// command; one too old to upgrade itself fails the rollout with a reason.
func TestSkipsAndRefusals(t *testing.T) {
	r := newRollout(2, 0, 5)
	nodes := fleet(r, "v1")
	nodes["n0"] = Node{Ready: true, Version: "v2", Capability: nodeproto.VersionUpgrade}
	r2, send := Step(r, nodes, t0)
	if !slices.Equal(send, []string{"n1"}) || r2.Nodes[0].State != store.RolloutNodeUpgraded {
		t.Fatalf("sends %v, n0 %s", send, r2.Nodes[0].State)
	}
	nodes["n1"] = Node{Ready: true, Version: "v1", Capability: nodeproto.VersionUpgrade - 1}
	r3, send := Step(r, nodes, t0)
	if len(send) != 0 || r3.State != store.RolloutStopped || !strings.Contains(r3.Reason, "by hand") {
		t.Fatalf("old agent: sends %v, state %s, reason %q", send, r3.State, r3.Reason)
	}
}
