package storetest

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

func testNodes(t *testing.T, s store.Store) {
	view(t, s, func(tx store.Tx) error {
		_, err := tx.GetNode("node-missing")
		wantKind(t, err, failure.ErrNotFound, "node-missing")
		nodes := must1[[]store.Node](t)(tx.ListNodes())
		if len(nodes) != 0 {
			t.Errorf("ListNodes on an empty store = %d nodes", len(nodes))
		}
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		for _, id := range []string{"node-b", "node-c", "node-a"} {
			must(t, tx.PutNode(sampleNode(id)))
		}
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "GetNode", must1[store.Node](t)(tx.GetNode("node-b")), sampleNode("node-b"))
		nodes := must1[[]store.Node](t)(tx.ListNodes())
		wantIDs(t, "ListNodes", ids(nodes, func(n store.Node) string { return n.ID }), []string{"node-a", "node-b", "node-c"})
		for _, n := range nodes {
			same(t, "ListNodes "+n.ID, n, sampleNode(n.ID))
		}
		return nil
	})
	// PutNode replaces, including dropping optional fields.
	replaced := sampleNode("node-b")
	replaced.FencingToken = 9
	replaced.Facts = nil
	replaced.LastSeenAt = nil
	update(t, s, func(tx store.Tx) error { return tx.PutNode(replaced) })
	view(t, s, func(tx store.Tx) error {
		got := must1[store.Node](t)(tx.GetNode("node-b"))
		same(t, "replaced node", got, replaced)
		if got.Facts != nil || got.FencingToken != 9 {
			t.Errorf("replaced node kept old fields: %+v", got)
		}
		if n := len(must1[[]store.Node](t)(tx.ListNodes())); n != 3 {
			t.Errorf("ListNodes after replace = %d nodes, want 3", n)
		}
		return nil
	})
}

func testInvitations(t *testing.T, s store.Store) {
	inv := sampleInvitation("inv-hash-1", "node-a")
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetInvitation("inv-hash-1")
		wantKind(t, err, failure.ErrNotFound, "inv-hash-1")
		wantKind(t, tx.PutInvitation(inv), failure.ErrNotFound, "inv-hash-1")
		return tx.CreateInvitation(inv)
	})
	update(t, s, func(tx store.Tx) error {
		same(t, "GetInvitation", must1[store.Invitation](t)(tx.GetInvitation("inv-hash-1")), inv)
		dup := sampleInvitation("inv-hash-1", "node-z")
		wantKind(t, tx.CreateInvitation(dup), failure.ErrConflict, "inv-hash-1")
		return nil
	})
	spent := inv
	spent.SpentAt = ptr(at(time.Hour))
	update(t, s, func(tx store.Tx) error {
		// The failed duplicate did not overwrite.
		same(t, "invitation after conflict", must1[store.Invitation](t)(tx.GetInvitation("inv-hash-1")), inv)
		return tx.PutInvitation(spent)
	})
	view(t, s, func(tx store.Tx) error {
		got := must1[store.Invitation](t)(tx.GetInvitation("inv-hash-1"))
		same(t, "spent invitation", got, spent)
		if got.SpentAt == nil || !got.SpentAt.Equal(at(time.Hour)) {
			t.Errorf("SpentAt = %v, want %v", got.SpentAt, at(time.Hour))
		}
		return nil
	})
}

func testSessions(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetSession("sess-missing")
		wantKind(t, err, failure.ErrNotFound, "sess-missing")
		must(t, tx.DeleteSessions("node-without-sessions"))
		must(t, tx.PutSession(sampleSession("sess-a1", "node-a")))
		must(t, tx.PutSession(sampleSession("sess-a2", "node-a")))
		return tx.PutSession(sampleSession("sess-b1", "node-b"))
	})
	renewed := sampleSession("sess-a1", "node-a")
	renewed.ExpiresAt = at(2 * time.Hour)
	update(t, s, func(tx store.Tx) error { return tx.PutSession(renewed) })
	view(t, s, func(tx store.Tx) error {
		same(t, "replaced session", must1[store.Session](t)(tx.GetSession("sess-a1")), renewed)
		same(t, "GetSession", must1[store.Session](t)(tx.GetSession("sess-b1")), sampleSession("sess-b1", "node-b"))
		return nil
	})
	update(t, s, func(tx store.Tx) error { return tx.DeleteSessions("node-a") })
	view(t, s, func(tx store.Tx) error {
		for _, h := range []string{"sess-a1", "sess-a2"} {
			_, err := tx.GetSession(h)
			wantKind(t, err, failure.ErrNotFound, h)
		}
		same(t, "other node's session", must1[store.Session](t)(tx.GetSession("sess-b1")), sampleSession("sess-b1", "node-b"))
		return nil
	})
}

func testOperations(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetOperation("op-missing")
		wantKind(t, err, failure.ErrNotFound, "op-missing")
		ops := must1[[]store.Operation](t)(tx.PendingOperations("node-a"))
		if len(ops) != 0 {
			t.Errorf("PendingOperations on an empty store = %d", len(ops))
		}
		// Stored out of order; "op-tie-*" share an instant.
		must(t, tx.PutOperation(sampleOperation("op-3", "node-a", at(3*time.Second))))
		must(t, tx.PutOperation(sampleOperation("op-tie-b", "node-a", at(time.Second))))
		must(t, tx.PutOperation(sampleOperation("op-1", "node-a", at(0))))
		must(t, tx.PutOperation(sampleOperation("op-tie-a", "node-a", at(time.Second))))
		must(t, tx.PutOperation(sampleOperation("op-b", "node-b", at(0))))
		done := sampleOperation("op-done", "node-a", at(-time.Second))
		done.Result = &nodeproto.Result{OperationID: "op-done", FencingToken: 4, Kind: nodeproto.KindLaunchWorkload, Outcome: nodeproto.OutcomeOK, At: at(time.Second)}
		return tx.PutOperation(done)
	})
	view(t, s, func(tx store.Tx) error {
		got := must1[[]store.Operation](t)(tx.PendingOperations("node-a"))
		wantIDs(t, "pending node-a", opIDs(got), []string{"op-1", "op-tie-a", "op-tie-b", "op-3"})
		for _, op := range got {
			same(t, "pending "+op.ID, op, sampleOperation(op.ID, "node-a", op.CreatedAt))
		}
		wantIDs(t, "pending node-b", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-b"))), []string{"op-b"})
		wantIDs(t, "pending node-z", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-z"))), []string{})
		// Of several nodes at once: each node's, in the same order; a node
		// with none (or unknown) absent.
		of := must1[map[string][]store.Operation](t)(tx.PendingOperationsOf([]string{"node-b", "node-z", "node-a"}))
		if len(of) != 2 {
			t.Errorf("PendingOperationsOf(node-b, node-z, node-a) has nodes %v, want node-a and node-b", slices.Sorted(maps.Keys(of)))
		}
		wantIDs(t, "pending of node-a", opIDs(of["node-a"]), []string{"op-1", "op-tie-a", "op-tie-b", "op-3"})
		wantIDs(t, "pending of node-b", opIDs(of["node-b"]), []string{"op-b"})
		for _, op := range of["node-a"] {
			same(t, "pending of "+op.ID, op, sampleOperation(op.ID, "node-a", op.CreatedAt))
		}
		if none := must1[map[string][]store.Operation](t)(tx.PendingOperationsOf(nil)); len(none) != 0 {
			t.Errorf("PendingOperationsOf(nil) = %v", none)
		}
		got1 := must1[store.Operation](t)(tx.GetOperation("op-done"))
		if got1.Result == nil || got1.Result.Outcome != nodeproto.OutcomeOK {
			t.Errorf("GetOperation op-done result = %+v", got1.Result)
		}
		return nil
	})
	// Recording a result takes it off the pending list.
	var withResult store.Operation
	update(t, s, func(tx store.Tx) error {
		op := must1[store.Operation](t)(tx.GetOperation("op-tie-a"))
		op.Result = &nodeproto.Result{OperationID: op.ID, Kind: op.Command.Kind, Outcome: nodeproto.OutcomeFailed, Error: "no such image", At: at(time.Minute)}
		withResult = op
		return tx.PutOperation(op)
	})
	view(t, s, func(tx store.Tx) error {
		wantIDs(t, "pending after result", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-a"))), []string{"op-1", "op-tie-b", "op-3"})
		wantIDs(t, "pending of node-a after result", opIDs(must1[map[string][]store.Operation](t)(tx.PendingOperationsOf([]string{"node-a"}))["node-a"]), []string{"op-1", "op-tie-b", "op-3"})
		same(t, "operation with result", must1[store.Operation](t)(tx.GetOperation("op-tie-a")), withResult)
		return nil
	})
}

func testEvents(t *testing.T, s store.Store) {
	see := func(tx store.Tx, nodeID, eventID string, want bool) {
		t.Helper()
		fresh, err := tx.SeeEvent(nodeID, eventID, at(0))
		if err != nil {
			t.Fatalf("SeeEvent(%s, %s): %v", nodeID, eventID, err)
		}
		if fresh != want {
			t.Errorf("SeeEvent(%s, %s) fresh = %v, want %v", nodeID, eventID, fresh, want)
		}
	}
	update(t, s, func(tx store.Tx) error {
		see(tx, "node-a", "000001", true)
		see(tx, "node-a", "000001", false) // within the same transaction
		see(tx, "node-a", "000002", true)
		see(tx, "node-b", "000001", true) // IDs are per node
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		see(tx, "node-a", "000001", false)
		see(tx, "node-a", "000002", false)
		see(tx, "node-b", "000001", false)
		see(tx, "node-b", "000002", true)
		return nil
	})
	// The batch form answers each in order, a repeat within the batch
	// fresh only its first time, and agrees with SeeEvent afterwards.
	seeAll := func(tx store.Tx, nodeID string, ids []string, want []bool) {
		t.Helper()
		fresh, err := tx.SeeEvents(nodeID, ids, at(0))
		if err != nil {
			t.Fatalf("SeeEvents(%s, %v): %v", nodeID, ids, err)
		}
		if !slices.Equal(fresh, want) {
			t.Errorf("SeeEvents(%s, %v) = %v, want %v", nodeID, ids, fresh, want)
		}
	}
	update(t, s, func(tx store.Tx) error {
		seeAll(tx, "node-a", []string{"000002", "000003", "000004", "000003"}, []bool{false, true, true, false})
		seeAll(tx, "node-c", nil, []bool{})
		see(tx, "node-a", "000004", false)
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		if _, err := tx.SeeEvents("node-a", []string{"000005"}, at(0)); err == nil {
			t.Error("SeeEvents in a read-only transaction succeeded")
		}
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		_, err := tx.SeeEvents("", []string{"000006"}, at(0))
		wantKind(t, err, failure.ErrInvalid, "node")
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		seeAll(tx, "node-a", []string{"000003", "000006"}, []bool{false, true})
		return nil
	})
	// Several nodes' batches at once answer as if seen one after the
	// other: node-a's second batch repeats its first's new ID.
	update(t, s, func(tx store.Tx) error {
		fresh, err := tx.SeeEventBatches([]store.EventCheck{
			{NodeID: "node-a", EventIDs: []string{"000006", "000007"}, At: at(0)},
			{NodeID: "node-d", EventIDs: []string{"000007", "000001"}, At: at(time.Second)},
			{NodeID: "node-a", EventIDs: []string{"000007", "000008"}, At: at(0)},
			{NodeID: "node-e"},
		})
		if err != nil {
			t.Fatalf("SeeEventBatches: %v", err)
		}
		want := [][]bool{{false, true}, {true, true}, {false, true}, {}}
		if fmt.Sprint(fresh) != fmt.Sprint(want) {
			t.Errorf("SeeEventBatches = %v, want %v", fresh, want)
		}
		see(tx, "node-d", "000001", false)
		see(tx, "node-a", "000008", false)
		_, err = tx.SeeEventBatches([]store.EventCheck{{NodeID: "node-a", EventIDs: []string{"000009"}}, {EventIDs: []string{"000001"}}})
		wantKind(t, err, failure.ErrInvalid, "node")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		if _, err := tx.SeeEventBatches([]store.EventCheck{{NodeID: "node-a", EventIDs: []string{"000010"}}}); err == nil {
			t.Error("SeeEventBatches in a read-only transaction succeeded")
		}
		return nil
	})
}

func testTokens(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetToken("tok-missing")
		wantKind(t, err, failure.ErrNotFound, "tok-missing")
		must(t, tx.CreateToken(sampleToken("tok-1")))
		must(t, tx.CreateToken(sampleToken("tok-2")))
		dup := sampleToken("tok-1")
		dup.Name = "impostor"
		wantKind(t, tx.CreateToken(dup), failure.ErrConflict, "tok-1")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "GetToken tok-1", must1[store.Token](t)(tx.GetToken("tok-1")), sampleToken("tok-1"))
		same(t, "GetToken tok-2", must1[store.Token](t)(tx.GetToken("tok-2")), sampleToken("tok-2"))
		return nil
	})
}
