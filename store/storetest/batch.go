package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// testBatches: the batch forms the placement path uses read and write what
// their single-record forms do. GetNodes and GetRuns return the stored
// records among the IDs, in ID order, once each, skipping missing ones (in
// both kinds of write transaction, where they lock); PutRuns rewrites the
// runs and their node index, and refuses a run that does not exist;
// PutOperations stores operations as pending work for their nodes, and
// GetOperations reads them back as GetRuns reads runs.
func testBatches(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		for _, id := range []string{"node-a", "node-b", "node-c"} {
			must(t, tx.PutNode(sampleNode(id)))
		}
		must(t, tx.CreateRun(sampleRun("run-1", at(0), api.RunQueued)))
		must(t, tx.CreateRun(sampleRun("run-2", at(time.Second), api.RunRunning, "node-a")))
		return nil
	})
	for name, write := range map[string]func(func(store.Tx) error){
		"Update":       func(fn func(store.Tx) error) { update(t, s, fn) },
		"UpdateLocked": func(fn func(store.Tx) error) { must(t, s.UpdateLocked(t.Context(), fn)) },
	} {
		write(func(tx store.Tx) error {
			nodes := must1[[]store.Node](t)(tx.GetNodes([]string{"node-c", "nobody", "node-a", "node-c"}))
			wantIDs(t, name+" GetNodes", ids(nodes, func(n store.Node) string { return n.ID }), []string{"node-a", "node-c"})
			same(t, name+" GetNodes node-a", nodes[0], sampleNode("node-a"))
			runs := must1[[]store.Run](t)(tx.GetRuns([]string{"run-2", "run-9", "run-1"}))
			wantIDs(t, name+" GetRuns", ids(runs, func(r store.Run) string { return r.ID }), []string{"run-1", "run-2"})
			same(t, name+" GetRuns run-2", runs[1], sampleRun("run-2", at(time.Second), api.RunRunning, "node-a"))
			if got := must1[[]store.Node](t)(tx.GetNodes(nil)); len(got) != 0 {
				t.Errorf("%s GetNodes(nil) = %d nodes", name, len(got))
			}
			return nil
		})
	}
	// run-1 placed on node-b, run-2 moved from node-a to node-c; two
	// launches for them.
	placed := sampleRun("run-1", at(0), api.RunPlaced, "node-b")
	moved := sampleRun("run-2", at(time.Second), api.RunRunning, "node-c")
	ops := []store.Operation{sampleOperation("op-1", "node-b", at(time.Minute)), sampleOperation("op-2", "node-c", at(time.Minute))}
	must(t, s.UpdateLocked(t.Context(), func(tx store.Tx) error {
		must1[[]store.Run](t)(tx.GetRuns([]string{"run-1", "run-2"}))
		must(t, tx.PutRuns([]store.Run{placed, moved}))
		return tx.PutOperations(ops)
	}))
	view(t, s, func(tx store.Tx) error {
		same(t, "run-1 after PutRuns", must1[store.Run](t)(tx.GetRun("run-1")), placed)
		same(t, "run-2 after PutRuns", must1[store.Run](t)(tx.GetRun("run-2")), moved)
		for node, want := range map[string][]string{"node-a": nil, "node-b": {"run-1"}, "node-c": {"run-2"}} {
			got := must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: node}))
			wantIDs(t, "runs on "+node, ids(got, func(r store.Run) string { return r.ID }), want)
		}
		for _, op := range ops {
			pending := must1[[]store.Operation](t)(tx.PendingOperations(op.NodeID))
			if len(pending) != 1 || pending[0].ID != op.ID {
				t.Errorf("pending on %s = %v, want %s", op.NodeID, pending, op.ID)
			}
			same(t, "operation "+op.ID, must1[store.Operation](t)(tx.GetOperation(op.ID)), op)
		}
		return nil
	})
	// GetOperations, in both kinds of write transaction (where it locks)
	// and in a view: in ID order, once each, missing ones skipped.
	for name, read := range map[string]func(func(store.Tx) error){
		"View":         func(fn func(store.Tx) error) { view(t, s, fn) },
		"UpdateLocked": func(fn func(store.Tx) error) { must(t, s.UpdateLocked(t.Context(), fn)) },
	} {
		read(func(tx store.Tx) error {
			got := must1[[]store.Operation](t)(tx.GetOperations([]string{"op-2", "op-404", "op-1", "op-2"}))
			wantIDs(t, name+" GetOperations", ids(got, func(op store.Operation) string { return op.ID }), []string{"op-1", "op-2"})
			if len(got) == 2 {
				same(t, name+" GetOperations op-2", got[1], ops[1])
			}
			if none := must1[[]store.Operation](t)(tx.GetOperations(nil)); len(none) != 0 {
				t.Errorf("%s GetOperations(nil) = %d operations", name, len(none))
			}
			return nil
		})
	}
	// A run that does not exist is refused, and the transaction keeps
	// nothing.
	err := s.Update(t.Context(), func(tx store.Tx) error {
		return tx.PutRuns([]store.Run{sampleRun("run-1", at(0), api.RunFailed), sampleRun("run-404", at(0), api.RunQueued)})
	})
	wantKind(t, err, failure.ErrNotFound, "run-404")
	view(t, s, func(tx store.Tx) error {
		same(t, "run-1 after a refused PutRuns", must1[store.Run](t)(tx.GetRun("run-1")), placed)
		return nil
	})
}

// testCreateRuns: CreateRuns stores every run of a batch, with its node
// index and its submission's fingerprint, as CreateRun would; an ID that
// exists or repeats in the batch is a conflict naming it (what a keyed
// submission's retry racing its first copy relies on), and the transaction
// keeps none of the batch.
func testCreateRuns(t *testing.T, s store.Store) {
	queued := sampleRun("batch-1", at(0), api.RunQueued)
	queued.Submission = "5f1c0ffee"
	placed := sampleRun("batch-2", at(time.Second), api.RunPlaced, "node-x")
	update(t, s, func(tx store.Tx) error { return tx.CreateRuns([]store.Run{queued, placed}) })
	view(t, s, func(tx store.Tx) error {
		same(t, "batch-1", must1[store.Run](t)(tx.GetRun("batch-1")), queued)
		same(t, "batch-2", must1[store.Run](t)(tx.GetRun("batch-2")), placed)
		got := must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: "node-x"}))
		wantIDs(t, "runs on node-x", ids(got, func(r store.Run) string { return r.ID }), []string{"batch-2"})
		return nil
	})
	for name, batch := range map[string][]store.Run{
		"an existing ID":     {sampleRun("batch-3", at(0), api.RunQueued), sampleRun("batch-1", at(0), api.RunQueued)},
		"an ID twice":        {sampleRun("batch-3", at(0), api.RunQueued), sampleRun("batch-4", at(0), api.RunQueued), sampleRun("batch-4", at(0), api.RunQueued)},
		"an empty batch too": nil,
	} {
		err := s.Update(t.Context(), func(tx store.Tx) error { return tx.CreateRuns(batch) })
		if batch == nil {
			must(t, err)
			continue
		}
		wantKind(t, err, failure.ErrConflict, batch[len(batch)-1].ID)
		view(t, s, func(tx store.Tx) error {
			if _, err := tx.GetRun("batch-3"); !errors.Is(err, failure.ErrNotFound) {
				t.Errorf("%s: batch-3 kept after the batch was refused (%v)", name, err)
			}
			return nil
		})
	}
}

// testLockedWritesInOrder: inside one UpdateLocked, what the batch writes
// wrote is what every later read sees (a store may hold such writes back to
// send them together: store/sqlstore/held.go), a later write of the same
// run wins, a transaction that fails keeps none of them, and one that
// checked a superseded epoch keeps none either.
func testLockedWritesInOrder(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		must(t, tx.PutNode(sampleNode("node-a")))
		must(t, tx.PutNode(sampleNode("node-b")))
		return tx.CreateRun(sampleRun("run-1", at(0), api.RunQueued))
	})
	placed := sampleRun("run-1", at(0), api.RunPlaced, "node-a")
	moved := sampleRun("run-1", at(0), api.RunRunning, "node-b")
	op := sampleOperation("op-1", "node-a", at(time.Minute))
	writes := func(tx store.Tx) {
		must1[[]store.Run](t)(tx.GetRuns([]string{"run-1"}))
		must(t, tx.PutRuns([]store.Run{placed}))
		must(t, tx.PutOperations([]store.Operation{op}))
		same(t, "run-1 read after its PutRuns", must1[store.Run](t)(tx.GetRun("run-1")), placed)
		onA := must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: "node-a"}))
		wantIDs(t, "runs on node-a after PutRuns", ids(onA, func(r store.Run) string { return r.ID }), []string{"run-1"})
		pending := must1[[]store.Operation](t)(tx.PendingOperations("node-a"))
		wantIDs(t, "pending on node-a after PutOperations", ids(pending, func(o store.Operation) string { return o.ID }), []string{"op-1"})
		must(t, tx.PutRuns([]store.Run{moved}))
	}
	kept := func(name string, want store.Run, wantOps []string) {
		view(t, s, func(tx store.Tx) error {
			same(t, name+": run-1", must1[store.Run](t)(tx.GetRun("run-1")), want)
			got := must1[[]store.Operation](t)(tx.PendingOperations("node-a"))
			wantIDs(t, name+": pending on node-a", ids(got, func(o store.Operation) string { return o.ID }), wantOps)
			return nil
		})
	}
	queued := sampleRun("run-1", at(0), api.RunQueued)
	errFailed := errors.New("the caller's failure")
	if err := s.UpdateLocked(t.Context(), func(tx store.Tx) error { writes(tx); return errFailed }); !errors.Is(err, errFailed) {
		t.Fatalf("a failing UpdateLocked = %v, want its own error", err)
	}
	kept("after a failed transaction", queued, nil)

	stale, err := s.Lead(t.Context())
	must(t, err)
	_, err = s.Lead(t.Context())
	must(t, err)
	err = s.UpdateLocked(t.Context(), func(tx store.Tx) error {
		if err := tx.CheckEpoch(stale); err != nil {
			return err
		}
		writes(tx)
		return nil
	})
	if !errors.Is(err, failure.ErrFenced) {
		t.Fatalf("an UpdateLocked under a superseded epoch = %v, want ErrFenced", err)
	}
	kept("after a fenced transaction", queued, nil)

	must(t, s.UpdateLocked(t.Context(), func(tx store.Tx) error { writes(tx); return nil }))
	kept("after a committed transaction", moved, []string{"op-1"})
	view(t, s, func(tx store.Tx) error {
		for node, want := range map[string][]string{"node-a": nil, "node-b": {"run-1"}} {
			got := must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: node}))
			wantIDs(t, "committed: runs on "+node, ids(got, func(r store.Run) string { return r.ID }), want)
		}
		return nil
	})
}
