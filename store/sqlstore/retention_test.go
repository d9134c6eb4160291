package sqlstore

import (
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// TestRetentionBackfill: rows written before schema version 5 (their
// retention columns NULL) get them from their documents and IDs in the
// migration, so the retention rules reach them.
func TestRetentionBackfill(t *testing.T) {
	forEachDB(t, func(t *testing.T, tdb testDB) {
		s, _ := tdb.open(t)
		ctx := t.Context()
		old := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		eventID := nodeproto.FormatEventID("inc", 7)
		err := s.Update(ctx, func(tx store.Tx) error {
			r := store.Run{Run: api.Run{ID: "r-legacy", Status: api.RunSucceeded, CreatedAt: old, UpdatedAt: old, FinishedAt: &old, Attempts: []api.Attempt{}}}
			if err := tx.CreateRun(r); err != nil {
				return err
			}
			if err := tx.PutSession(store.Session{TokenHash: "s-legacy", NodeID: "n1", ExpiresAt: old, CreatedAt: old}); err != nil {
				return err
			}
			if err := tx.CreateInvitation(store.Invitation{TokenHash: "i-legacy", NodeID: "n1", CreatedAt: old, ExpiresAt: old}); err != nil {
				return err
			}
			_, err := tx.SeeEvent("n1", eventID, old)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		// As version 4 left them.
		for _, stmt := range []string{
			`UPDATE runs SET finished_sec = NULL`, `UPDATE sessions SET expires_sec = NULL`,
			`UPDATE invitations SET done_sec = NULL`, `UPDATE events SET incarnation = NULL, seq = NULL`,
		} {
			if _, err := s.db.ExecContext(ctx, stmt); err != nil {
				t.Fatal(err)
			}
		}
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := retentionBackfill(ctx, tx); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		now := old.Add(time.Hour)
		err = s.Update(ctx, func(tx store.Tx) error {
			if err := tx.AdvanceEventWatermark("n1", eventID); err != nil {
				return err
			}
			runs, _, err := tx.PruneRuns(now, 10)
			if err != nil {
				return err
			}
			sessions, err := tx.PruneSessions(now, 10)
			if err != nil {
				return err
			}
			invitations, err := tx.PruneInvitations(now, 10)
			if err != nil {
				return err
			}
			events, err := tx.PruneEvents(10)
			if err != nil {
				return err
			}
			if runs != 1 || sessions != 1 || invitations != 1 || events != 1 {
				t.Errorf("pruned after backfill: %d runs, %d sessions, %d invitations, %d events; want 1 each", runs, sessions, invitations, events)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
