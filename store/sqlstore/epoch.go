package sqlstore

import (
	"context"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// epochMigration holds the scheduling epoch: one row, bumped by each
// replica that starts to schedule (Store.Lead) and checked by every
// placement transaction (txn.CheckEpoch).
var epochMigration = []string{
	`CREATE TABLE scheduling_epoch (id INTEGER PRIMARY KEY, epoch BIGINT NOT NULL)`,
	`INSERT INTO scheduling_epoch (id, epoch) VALUES (1, 0)`,
}

// Lead implements store.Store. On PostgreSQL the update waits for every
// transaction that holds the row shared (a placement that checked the old
// epoch) to end, so those commit before any replica leads under the new
// one; SQLite has one writer, which orders them the same way.
func (s *Store) Lead(ctx context.Context) (int64, error) {
	var epoch int64
	err := s.Update(ctx, func(tx store.Tx) error {
		t := tx.(*txn)
		if err := t.writable(); err != nil {
			return err
		}
		err := t.queryRowContext(`UPDATE scheduling_epoch SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch`).Scan(&epoch)
		if err != nil {
			return t.dbError(err, "lead", "scheduling epoch", "1")
		}
		return nil
	})
	return epoch, err
}

// CheckEpoch implements store.Tx. On PostgreSQL the row is read FOR SHARE,
// so a Lead cannot commit a new epoch until this transaction ends, and a
// Lead that committed first is seen (READ COMMITTED re-reads the row once
// the lock is free).
func (t *txn) CheckEpoch(epoch int64) error {
	if err := t.readable(); err != nil {
		return err
	}
	if t.holding() {
		t.held.epochs = append(t.held.epochs, epoch) // checked with the last writes (held.go)
		return nil
	}
	query := `SELECT epoch FROM scheduling_epoch WHERE id = 1`
	if t.d.lockingTx != nil && t.write {
		query += " FOR SHARE" // a View only reads; it fences nothing
	}
	var current int64
	if err := t.queryRowContext(query).Scan(&current); err != nil {
		return t.dbError(err, "check", "scheduling epoch", "1")
	}
	if current != epoch {
		return failure.Fenced("scheduling epoch %d is over: another replica has scheduled since, under epoch %d", epoch, current)
	}
	return nil
}
