package api

import "testing"

// TestStageOfAGang: a gang's stage names its nodes and set, not its last
// member's node, and says when it is stopping a broken set's members.
func TestStageOfAGang(t *testing.T) {
	r := Run{RunSpec: RunSpec{Nodes: 2}, Status: RunRunning, Attempts: []Attempt{{Number: 1, NodeID: "a", Set: 1}, {Number: 2, NodeID: "b", Set: 1, Rank: 1}}}
	if got := r.Stage(); got != "running on 2 nodes (attempt set 1)" {
		t.Errorf("Stage() = %q", got)
	}
	r.Reason = "stopping the other members: attempt set 1: rank 1 (attempt 2 on node b) failed"
	if got := r.Stage(); got != "running on 2 nodes (attempt set 1): "+r.Reason {
		t.Errorf("Stage() while stopping = %q", got)
	}
	if got := (Run{Status: RunRunning, Attempts: []Attempt{{NodeID: "a"}}}).Stage(); got != "running on node a" {
		t.Errorf("a single run's Stage() = %q", got)
	}
}
