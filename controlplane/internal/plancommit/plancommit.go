// Package plancommit is what one reconcile pass writes for the scheduler's
// plan, inside the transaction the control plane gives it: each placement
// unit (one run's placement, or a gang's members: gang.Units) becomes the
// run's attempts and its nodes' commands, whole or not at all (Apply,
// UnitLaunches, Place), and a waiting run's reason is rewritten only when
// it is due (ReasonDue).
//
// It exists so that the commit's logic (which runs changed since the
// snapshot, which agents are too old for their commands, which reasons are
// worth a write) is apart from the Server's transactions, epochs and
// signals (controlplane/runs_reconcile.go), and is tested on its own. It
// holds no state and reads and writes only through the transaction it is
// given; the caller checks the scheduling epoch and creates each operation
// (its ID, fencing token and time). Only package controlplane imports it.
package plancommit

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/gang"
	"github.com/mercator/mercator/controlplane/internal/placement"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// NodeIDs is the nodes placements name, sorted, each once: the order Apply
// reads their records in.
func NodeIDs(placements []scheduler.Placement) []string {
	nodeIDs := make([]string, 0, len(placements))
	for _, p := range placements {
		nodeIDs = append(nodeIDs, p.NodeID)
	}
	slices.Sort(nodeIDs)
	return slices.Compact(nodeIDs)
}

// NewOperation makes cmd a new operation for the node under its fencing
// token (the caller gives it an ID and a time).
type NewOperation func(nodeID string, fence uint64, cmd nodeproto.Command) store.Operation

// Apply commits placements in tx: each unit's attempts on its run and its
// launches (with their prepare_artifact commands) as operations, returning
// how many runs it placed and, by run ID, why a unit was not placed now
// (UnitLaunches). A run that changed since the snapshot (pending: the runs
// as the plan saw them) is left for the next pass. nodeIDs is
// NodeIDs(placements). Every read and write is a batch (store.Tx.GetNodes,
// GetRuns, PutOperations, PutRuns), a few statements for the whole chunk.
func Apply(tx store.Tx, placements []scheduler.Placement, nodeIDs []string, pending map[string]store.Run, now func() time.Time, newOp NewOperation) (placed int, tooOld map[string]string, err error) {
	// The nodes' records first, once each and in ID order: on
	// PostgreSQL each read locks its row, and every writer of node rows
	// takes them in ID order too, so they wait for each other rather than
	// deadlock (which PostgreSQL breaks only after a second, and which,
	// with the rows taken in plan order, stalled placements at tens a
	// second behind a long queue). A liveness flush no longer takes them
	// at all: its moments have a table of their own (store.Tx.NodesSeen).
	stored, err := tx.GetNodes(nodeIDs)
	if err != nil {
		return 0, nil, err
	}
	nodes := make(map[string]store.Node, len(stored))
	for _, n := range stored {
		nodes[n.ID] = n
	}
	tooOld = map[string]string{}
	runIDs := make([]string, len(placements))
	for i, p := range placements {
		runIDs[i] = p.RunID
	}
	slices.Sort(runIDs)
	storedRuns, err := tx.GetRuns(slices.Compact(runIDs))
	if err != nil {
		return 0, nil, err
	}
	runs := make(map[string]store.Run, len(storedRuns))
	for _, r := range storedRuns {
		runs[r.ID] = r
	}
	at := now()
	var ops []store.Operation
	var written []store.Run
	// A unit is one run's placement, or a gang's members, which
	// commit together or not at all.
	for _, unit := range gang.Units(placements) {
		run, ok := runs[unit[0].RunID]
		if !ok || run.Status != api.RunQueued || run.Cancel || len(run.Attempts) != len(pending[run.ID].Attempts) {
			continue // gone or changed since the snapshot; the next pass sees it
		}
		delete(runs, run.ID) // placed once, whatever the plan says
		cmds, why, err := UnitLaunches(tx, run, unit, nodes)
		if err != nil {
			return 0, nil, err
		}
		if why != "" {
			tooOld[run.ID] = why
			continue
		}
		Place(&run, unit, at)
		for i, p := range unit {
			for _, c := range cmds[i] {
				ops = append(ops, newOp(p.NodeID, nodes[p.NodeID].FencingToken, c))
			}
		}
		written = append(written, run)
	}
	if err := tx.PutOperations(ops); err != nil {
		return 0, nil, err
	}
	return len(written), tooOld, tx.PutRuns(written)
}

// UnitLaunches is what a placement unit (one run's placement, or every
// member of a gang: gang.Units) sends its nodes, by placement: the
// prepare_artifact commands ahead of the launch, then the launch, whose
// attempt numbers follow the run's. It reads the nodes' records in nodes
// and the Artifacts in tx. A non-empty why is why the unit is not placed
// now (a node whose agent is too old, a gang plan that does not hold
// every member): a gang commits whole or not at all.
func UnitLaunches(tx store.Tx, run store.Run, unit []scheduler.Placement, nodes map[string]store.Node) (cmds [][]nodeproto.Command, why string, err error) {
	isGang := lifecycle.Gang(&run.Run)
	if isGang && len(unit) != run.Nodes {
		return nil, fmt.Sprintf("waiting: gang of %d: the plan held %d members; placing it again", run.Nodes, len(unit)), nil
	}
	master := ""
	if isGang {
		master = gang.MasterAddr(nodes[unit[0].NodeID])
	}
	for i, p := range unit {
		n, known := nodes[p.NodeID]
		if !known {
			return nil, fmt.Sprintf("waiting: node %s is gone; placing the run again", p.NodeID), nil
		}
		cmd := placement.Launch(run, len(run.Attempts)+1+i, p.GPUs)
		if isGang {
			cmd = gang.Launch(run, len(run.Attempts)+1+i, i, p.GPUs, master)
		}
		prepares, err := placement.PrepareArtifacts(tx, p.NodeID, run, cmd.LaunchWorkload)
		if err != nil {
			return nil, "", err
		}
		have := 0
		if n.Facts != nil {
			have = n.Facts.CapabilityVersion
		}
		// Every command goes only to an agent that speaks it; otherwise
		// the run waits, and says why.
		all := append(prepares, cmd)
		if why := placement.TooOld(p.NodeID, have, all); why != "" {
			return nil, why, nil
		}
		cmds = append(cmds, all)
	}
	return cmds, "", nil
}

// Place records the unit's attempts on run: one attempt, or a gang's new
// attempt set (lifecycle.PlaceGang).
func Place(run *store.Run, unit []scheduler.Placement, now time.Time) {
	if !lifecycle.Gang(&run.Run) {
		lifecycle.Place(&run.Run, unit[0].NodeID, unit[0].GPUs, now)
		return
	}
	members := make([]lifecycle.Member, len(unit))
	for i, p := range unit {
		members[i] = lifecycle.Member{NodeID: p.NodeID, GPUs: p.GPUs}
	}
	lifecycle.PlaceGang(&run.Run, members, now)
}

// ReasonDue reports whether a queued run's stored reason should become
// why: when it has none from the scheduler yet (none at all, or the one
// it was submitted or requeued with), or when it differs and was written
// at least ReasonRefresh ago. Reasons count nodes ("3 nodes have too little free
// memory"), and the counts move as the fleet fills and frees: rewritten at
// every pass, a backlog of a hundred thousand runs was a hundred thousand
// writes a pass, which on PostgreSQL held placements to a few hundred a
// second. A reason shown is then at most ReasonRefresh old; the queue's
// order and positions (controlplane/runs_queue.go) are the pass's own.
func ReasonDue(r store.Run, why string, now time.Time) bool {
	if r.Reason == why {
		return false
	}
	return !strings.HasPrefix(r.Reason, SchedulerReason) || now.Sub(r.UpdatedAt) >= ReasonRefresh
}

// SchedulerReason starts every reason the scheduler gives a waiting run
// (package scheduler).
const SchedulerReason = "waiting: "

// ReasonRefresh is how long a waiting run's stored reason stands before a
// different one replaces it.
const ReasonRefresh = 10 * time.Second
