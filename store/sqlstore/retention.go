package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// retentionMigration adds what the retention rules (store.RetentionTx)
// select on: each a column derived from the document on every write, and
// the index that makes a bounded prune a range scan rather than a read of
// the whole table. The new columns are NULL for rows that are never pruned
// by time (a run that is not terminal, an event ID without a sequence);
// retentionBackfill fills them for the rows written before.
var retentionMigration = []string{
	`ALTER TABLE runs ADD COLUMN finished_sec BIGINT`,
	`CREATE INDEX runs_by_finished ON runs (finished_sec, id)`,
	`CREATE INDEX operations_done ON operations (pending, created_sec, created_nsec, id)`,
	`CREATE INDEX fn_calls_done ON fn_calls (pending, created_sec, created_nsec, id)`,
	`ALTER TABLE sessions ADD COLUMN expires_sec BIGINT`,
	`CREATE INDEX sessions_by_expiry ON sessions (expires_sec)`,
	`ALTER TABLE invitations ADD COLUMN done_sec BIGINT`,
	`CREATE INDEX invitations_by_done ON invitations (done_sec)`,
	`ALTER TABLE events ADD COLUMN incarnation TEXT`,
	`ALTER TABLE events ADD COLUMN seq BIGINT`,
	`CREATE INDEX events_by_seq ON events (node_id, incarnation, seq)`,
	// One row per node and agent incarnation: the highest sequence the
	// node declared it will never send as new (AdvanceEventWatermark).
	`CREATE TABLE event_watermarks (
		node_id TEXT NOT NULL,
		incarnation TEXT NOT NULL,
		seq BIGINT NOT NULL,
		PRIMARY KEY (node_id, incarnation)
	)`,
}

// retentionBackfill derives the new columns of rows written before
// retentionMigration, in the migration's transaction: the documents are
// decoded here rather than in SQL, because SQLite and PostgreSQL read JSON
// and times differently, and record holds the one rule.
func retentionBackfill(ctx context.Context, tx *sql.Tx) error {
	fill := func(what, query, update string, derive func(key string, doc []byte) (any, error)) error {
		rows, err := tx.QueryContext(ctx, query)
		if err != nil {
			return fmt.Errorf("backfill %s: %w", what, err)
		}
		type row struct {
			key string
			val any
		}
		var out []row
		for rows.Next() {
			var key string
			var doc []byte
			if err := rows.Scan(&key, &doc); err != nil {
				rows.Close()
				return fmt.Errorf("backfill %s: %w", what, err)
			}
			v, err := derive(key, doc)
			if err != nil {
				rows.Close()
				return err
			}
			if v != nil {
				out = append(out, row{key, v})
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("backfill %s: %w", what, err)
		}
		for _, r := range out {
			if _, err := tx.ExecContext(ctx, update, r.key, r.val); err != nil {
				return fmt.Errorf("backfill %s %q: %w", what, r.key, err)
			}
		}
		return nil
	}
	if err := fill("runs", `SELECT id, doc FROM runs`, `UPDATE runs SET finished_sec = $2 WHERE id = $1`,
		func(id string, doc []byte) (any, error) {
			r, err := decode[store.Run]("run", id, doc)
			if sec, ok := record.RunFinished(r); err == nil && ok {
				return sec, nil
			}
			return nil, err
		}); err != nil {
		return err
	}
	if err := fill("sessions", `SELECT token_hash, doc FROM sessions`, `UPDATE sessions SET expires_sec = $2 WHERE token_hash = $1`,
		func(hash string, doc []byte) (any, error) {
			s, err := decode[store.Session]("session", hash, doc)
			return s.ExpiresAt.Unix(), err
		}); err != nil {
		return err
	}
	if err := fill("invitations", `SELECT token_hash, doc FROM invitations`, `UPDATE invitations SET done_sec = $2 WHERE token_hash = $1`,
		func(hash string, doc []byte) (any, error) {
			inv, err := decode[store.Invitation]("invitation", hash, doc)
			return record.InvitationDone(inv), err
		}); err != nil {
		return err
	}
	// Events have no document: their parts come from the ID alone, so
	// every row of one ID (one per node that sent it) gets the same.
	rows, err := tx.QueryContext(ctx, `SELECT DISTINCT event_id FROM events`)
	if err != nil {
		return fmt.Errorf("backfill events: %w", err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fmt.Errorf("backfill events: %w", err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("backfill events: %w", err)
	}
	for _, id := range ids {
		if inc, seq, ok := record.EventSeq(id); ok {
			if _, err := tx.ExecContext(ctx, `UPDATE events SET incarnation = $2, seq = $3 WHERE event_id = $1`, id, inc, seq); err != nil {
				return fmt.Errorf("backfill event %q: %w", id, err)
			}
		}
	}
	return nil
}

// nullable is v, or NULL when !ok.
func nullable(v int64, ok bool) any {
	if !ok {
		return nil
	}
	return v
}

// pruneByKey deletes up to limit rows of table whose key column the
// subquery pick selects (it ends in "LIMIT $N", N the last argument), and
// reports how many it deleted. DELETE … LIMIT is SQLite's alone; a keyed
// IN (SELECT … LIMIT) is both databases'.
func (t *txn) pruneByKey(table, key, pick string, args ...any) (int, error) {
	n, err := t.affected("prune", table, "", `DELETE FROM `+table+` WHERE `+key+` IN (`+pick+`)`, args...)
	return int(n), err
}

// pruneBefore deletes up to limit rows of table whose key pick selects,
// pick taking the moment before as $1 (Unix seconds) and limit as $2: the
// shape of every prune but the runs', which also takes their logs.
func (t *txn) pruneBefore(table, key, pick string, before time.Time, limit int) (int, error) {
	if err := t.pruneChecked(limit); err != nil {
		return 0, err
	}
	return t.pruneByKey(table, key, pick, before.Unix(), limit)
}

func (t *txn) pruneChecked(limit int) error {
	if err := record.PruneLimit(limit); err != nil {
		return err
	}
	return t.writable()
}

func (t *txn) PruneRuns(before time.Time, limit int) (int, bool, error) {
	if err := t.pruneChecked(limit); err != nil {
		return 0, false, err
	}
	rows, err := t.queryContext(`SELECT id FROM runs WHERE finished_sec < $1 ORDER BY finished_sec, id LIMIT $2`,
		before.Unix(), limit)
	if err != nil {
		return 0, false, t.dbError(err, "prune", "runs", "")
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, false, t.dbError(err, "prune", "runs", "")
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, false, t.dbError(err, "prune", "runs", "")
	}
	budget, runs := limit, 0
	for _, id := range ids {
		n, err := t.pruneByKey("log_chunks", "(run_id, attempt, start_offset)",
			`SELECT run_id, attempt, start_offset FROM log_chunks WHERE run_id = $1 LIMIT $2`, id, budget)
		if err != nil {
			return runs, false, err
		}
		if budget -= n; budget == 0 {
			return runs, true, nil
		}
		if _, err := t.exec("prune", "run", id, `DELETE FROM run_nodes WHERE run_id = $1`, id); err != nil {
			return runs, false, err
		}
		if _, err := t.exec("prune", "run", id, `DELETE FROM runs WHERE id = $1`, id); err != nil {
			return runs, false, err
		}
		runs++
		if budget--; budget == 0 {
			return runs, true, nil
		}
	}
	return runs, false, nil
}

func (t *txn) PruneOperations(before time.Time, limit int) (int, error) {
	return t.pruneBefore("operations", "id",
		`SELECT id FROM operations WHERE pending = 0 AND created_sec < $1 ORDER BY created_sec, created_nsec, id LIMIT $2`, before, limit)
}

func (t *txn) PruneCalls(before time.Time, limit int) (int, error) {
	return t.pruneBefore("fn_calls", "id",
		`SELECT id FROM fn_calls WHERE pending = 0 AND created_sec < $1 ORDER BY created_sec, created_nsec, id LIMIT $2`, before, limit)
}

func (t *txn) PruneSessions(before time.Time, limit int) (int, error) {
	return t.pruneBefore("sessions", "token_hash",
		`SELECT token_hash FROM sessions WHERE expires_sec < $1 ORDER BY expires_sec, token_hash LIMIT $2`, before, limit)
}

func (t *txn) PruneInvitations(before time.Time, limit int) (int, error) {
	return t.pruneBefore("invitations", "token_hash",
		`SELECT token_hash FROM invitations WHERE done_sec < $1 ORDER BY done_sec, token_hash LIMIT $2`, before, limit)
}

func (t *txn) AdvanceEventWatermark(nodeID, eventID string) error {
	inc, seq, err := record.Watermark(nodeID, eventID)
	if err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	_, err = t.exec("advance", "event watermark", nodeID+"/"+eventID,
		`INSERT INTO event_watermarks (node_id, incarnation, seq) VALUES ($1, $2, $3)
		 ON CONFLICT (node_id, incarnation) DO UPDATE SET seq = excluded.seq
		 WHERE event_watermarks.seq < excluded.seq`, nodeID, inc, seq)
	return err
}

func (t *txn) PruneEvents(limit int) (int, error) {
	if err := t.pruneChecked(limit); err != nil {
		return 0, err
	}
	return t.pruneByKey("events", "(node_id, event_id)",
		`SELECT e.node_id, e.event_id FROM event_watermarks w
		 JOIN events e ON e.node_id = w.node_id AND e.incarnation = w.incarnation AND e.seq <= w.seq
		 LIMIT $1`, limit)
}
