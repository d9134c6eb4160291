// Package rollout is the pure logic of an agent rollout: given a rollout
// (store.Rollout) and what the control plane knows of its nodes now, which
// nodes are upgraded, which failed, whether it stops or is done, and which
// nodes get the upgrade command next. The control plane's rollout loop
// (controlplane/upgrades_rollout.go) does the I/O around it.
//
// The rules (docs/upgrades.md): the first Canary nodes go first, alone; the
// rest go only once every canary came back connected reporting the new
// version, at most MaxParallel nodes in flight at a time; the first
// failure stops the rollout (no new node is sent the command; those in
// flight finish or fail on their own).
//
// Only package controlplane imports rollout.
package rollout

import (
	"fmt"
	"time"

	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Node is what the control plane knows of one node of a rollout.
type Node struct {
	// Ready: inside its lease.
	Ready bool
	// Version is the agent version its last facts stated.
	Version string
	// Capability is the capability version its last facts stated.
	Capability int
	// Result is the upgrade command's result, nil while none came back.
	Result *nodeproto.Result
	// Gone: the node no longer exists or was removed.
	Gone bool
}

// Grace is added to a rollout's deadline before a node that was sent the
// command and never answered is failed: the agent's own deadline runs from
// its exec, a little after the command was sent.
const Grace = 30 * time.Second

// Step advances r to now given its nodes (by ID; a node missing from
// nodes counts as Gone). It returns the rollout as it is now (r is not
// changed) and the IDs of the nodes to send the command to, already marked
// sent in the returned rollout (SentAt now, OperationID for the caller to
// fill). A rollout that is not running is returned as it is.
func Step(r store.Rollout, nodes map[string]Node, now time.Time) (store.Rollout, []string) {
	if r.State != store.RolloutRunning {
		return r, nil
	}
	r.Nodes = append([]store.RolloutNode(nil), r.Nodes...)
	for i := range r.Nodes {
		settle(&r.Nodes[i], r, nodes[r.Nodes[i].ID], now)
	}
	for _, rn := range r.Nodes {
		if rn.State == store.RolloutNodeFailed {
			r.State = store.RolloutStopped
			r.Reason = fmt.Sprintf("node %s: %s", rn.ID, rn.Error)
			r.UpdatedAt = now
			return r, nil
		}
	}
	canary := min(r.Canary, len(r.Nodes))
	limit := len(r.Nodes)
	if !allUpgraded(r.Nodes[:canary]) {
		limit = canary // the canaries alone until they are back
	}
	inFlight := 0
	for _, rn := range r.Nodes {
		if rn.State == store.RolloutNodeSent {
			inFlight++
		}
	}
	parallel := r.MaxParallel
	if parallel <= 0 {
		parallel = 1
	}
	var send []string
	for i := 0; i < limit && inFlight < parallel; i++ {
		rn := &r.Nodes[i]
		if rn.State != store.RolloutNodePending {
			continue
		}
		rn.State = store.RolloutNodeSent
		sent := now
		rn.SentAt = &sent
		send = append(send, rn.ID)
		inFlight++
	}
	if allUpgraded(r.Nodes) {
		r.State = store.RolloutSucceeded
	}
	if len(send) > 0 || r.State != store.RolloutRunning {
		r.UpdatedAt = now
	}
	return r, send
}

// settle moves one node's state on from what the control plane knows.
func settle(rn *store.RolloutNode, r store.Rollout, n Node, now time.Time) {
	switch rn.State {
	case store.RolloutNodePending:
		switch {
		case n.Gone:
			rn.State, rn.Error = store.RolloutNodeFailed, "the node was removed"
		case n.Version == r.Version:
			rn.State = store.RolloutNodeUpgraded // already there: nothing to send
		case n.Capability != 0 && n.Capability < nodeproto.VersionUpgrade:
			rn.State = store.RolloutNodeFailed
			rn.Error = fmt.Sprintf("its agent speaks capability version %d and cannot upgrade itself (it needs %d): replace its binary by hand", n.Capability, nodeproto.VersionUpgrade)
		}
	case store.RolloutNodeSent:
		switch {
		case n.Result != nil && n.Result.Outcome != nodeproto.OutcomeOK:
			rn.State, rn.Error = store.RolloutNodeFailed, n.Result.Error
		case n.Result != nil && n.Ready && n.Version == r.Version:
			rn.State = store.RolloutNodeUpgraded
		case n.Gone:
			rn.State, rn.Error = store.RolloutNodeFailed, "the node was removed"
		case rn.SentAt != nil && now.Sub(*rn.SentAt) > r.Deadline+Grace:
			rn.State = store.RolloutNodeFailed
			rn.Error = fmt.Sprintf("did not come back connected reporting version %s within %s of the command", r.Version, r.Deadline+Grace)
		}
	}
}

func allUpgraded(ns []store.RolloutNode) bool {
	for _, rn := range ns {
		if rn.State != store.RolloutNodeUpgraded {
			return false
		}
	}
	return true
}
