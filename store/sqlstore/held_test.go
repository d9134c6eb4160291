package sqlstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

func TestRenumber(t *testing.T) {
	for _, c := range []struct {
		query string
		by    int
		want  string
	}{
		{"SELECT $1", 0, "SELECT $1"},
		{"unnest($1::text[], $2::bigint[]) WHERE a = $10", 3, "unnest($4::text[], $5::bigint[]) WHERE a = $13"},
		{"no parameters", 7, "no parameters"},
	} {
		if got := renumber(c.query, c.by); got != c.want {
			t.Errorf("renumber(%q, %d) = %q, want %q", c.query, c.by, got, c.want)
		}
	}
}

// TestHeldStatement: held writes become one statement, each a WITH query
// numbering its parameters after the ones before, the row the counts the
// returning ones must match and, with epoch, the epoch read FOR SHARE.
func TestHeldStatement(t *testing.T) {
	query, args, cols := heldStatement([]heldWrite{
		{query: "UPDATE runs SET doc = $2 WHERE id = $1 RETURNING id", args: []any{"r", "d"}, returns: 1},
		{query: "INSERT INTO operations (id) VALUES ($1)", args: []any{"op"}, returns: -1},
	}, true)
	want := "WITH w0 AS (UPDATE runs SET doc = $2 WHERE id = $1 RETURNING id), w1 AS (INSERT INTO operations (id) VALUES ($3)), " +
		"e AS (SELECT epoch FROM scheduling_epoch WHERE id = 1 FOR SHARE) SELECT (SELECT count(*) FROM w0), COALESCE((SELECT epoch FROM e), 0)"
	if query != want || len(args) != 3 || args[2] != "op" || cols != 2 {
		t.Errorf("heldStatement =\n%s %v (%d columns)\nwant\n%s [r d op] (2 columns)", query, args, cols, want)
	}
	if query, _, _ := heldStatement(nil, true); query != "WITH e AS (SELECT epoch FROM scheduling_epoch WHERE id = 1 FOR SHARE) SELECT COALESCE((SELECT epoch FROM e), 0)" {
		t.Errorf("an epoch check alone = %s", query)
	}
}

// TestPostgresHoldsPlacementWrites: a placement's writes in an UpdateLocked
// on PostgreSQL (its runs read locked, then written, its operations, its
// epoch check) are held and leave in one statement as it commits; the
// store's conformance suite (LockedWritesInOrder) checks what they write.
func TestPostgresHoldsPlacementWrites(t *testing.T) {
	s, _ := postgresDB.open(t)
	ctx := t.Context()
	epoch, err := s.Lead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	run := store.Run{Run: api.Run{ID: "run-1", Status: api.RunQueued, CreatedAt: time.Unix(1, 0).UTC()}}
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.CreateRun(run) }); err != nil {
		t.Fatal(err)
	}
	var heldWrites, heldEpochs int
	err = s.UpdateLocked(ctx, func(tx store.Tx) error {
		if err := tx.CheckEpoch(epoch); err != nil {
			return err
		}
		if _, err := tx.GetRuns([]string{"run-1"}); err != nil {
			return err
		}
		placed := run
		placed.Status = api.RunPlaced
		placed.Attempts = []api.Attempt{{Number: 1, NodeID: "node-a"}}
		if err := tx.PutOperations([]store.Operation{{ID: "op-1", NodeID: "node-a", CreatedAt: time.Unix(2, 0).UTC()}}); err != nil {
			return err
		}
		if err := tx.PutRuns([]store.Run{placed}); err != nil {
			return err
		}
		h := tx.(*txn).held
		heldWrites, heldEpochs = len(h.writes), len(h.epochs)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if heldWrites != 3 || heldEpochs != 1 {
		t.Errorf("held %d writes and %d epoch checks before the commit, want 3 (operations, runs, run_nodes) and 1", heldWrites, heldEpochs)
	}
}

// TestPostgresHeldSendFailureIsTheError: when held writes fail as they are
// sent (here a statement on a table that does not exist), the transaction
// is aborted and commits nothing, and Update's error is that failure, not
// the "transaction is aborted" of the statement that caused the send,
// whether fn returned that statement's error or swallowed it.
func TestPostgresHeldSendFailureIsTheError(t *testing.T) {
	s, _ := postgresDB.open(t)
	for _, swallow := range []bool{false, true} {
		err := s.UpdateLocked(t.Context(), func(tx store.Tx) error {
			if err := tx.PutNode(store.Node{ID: "kept-if-committed"}); err != nil {
				return err
			}
			tt := tx.(*txn)
			if err := tt.hold(heldWrite{table: "nowhere", query: "INSERT INTO no_such_table (id) VALUES ($1)", args: []any{"x"}, returns: -1, what: "thing", id: "x"}); err != nil {
				return err
			}
			_, err := tx.GetNode("kept-if-committed") // sends the held write first
			if swallow {
				return nil
			}
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "no_such_table") {
			t.Errorf("swallowed %v: UpdateLocked = %v, want the failed send's error", swallow, err)
		}
	}
	err := s.View(t.Context(), func(tx store.Tx) error { _, err := tx.GetNode("kept-if-committed"); return err })
	if !errors.Is(err, failure.ErrNotFound) {
		t.Errorf("a transaction whose send failed kept its writes (%v)", err)
	}
}

// TestPostgresHeldEpochCheckAloneFails: a transaction holding only its
// epoch check, whose send fails (its context ended before the commit),
// returns the failure and commits nothing.
func TestPostgresHeldEpochCheckAloneFails(t *testing.T) {
	s, _ := postgresDB.open(t)
	epoch, err := s.Lead(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	err = s.UpdateLocked(ctx, func(tx store.Tx) error {
		if err := tx.CheckEpoch(epoch); err != nil {
			return err
		}
		cancel()
		return nil
	})
	if err == nil {
		t.Fatal("an UpdateLocked whose epoch check could not be sent committed")
	}
}
