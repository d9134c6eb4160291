package sqlstore

import (
	"context"
	"fmt"
)

// ScrubFreeSpace rewrites an SQLite database so that no bytes of deleted or
// overwritten records linger in its free space or its write-ahead log:
// SQLite leaves a freed cell's bytes in the page until the space is used
// again, so a record rewritten without a secret may still show it to
// anyone who reads the file. It runs VACUUM, which rebuilds every page,
// then a checkpoint that truncates the log. The control plane calls it
// once, after it sealed secrets an earlier version stored in the clear.
// It waits for writers and blocks them while it runs (a rewrite of the
// whole file), so it is not for a busy store.
//
// With PostgreSQL it does nothing: dead row versions are reclaimed by
// autovacuum, and the server's own write-ahead log and its archives are
// the operator's to manage.
func (s *Store) ScrubFreeSpace(ctx context.Context) error {
	if s.d != sqliteDialect {
		return nil
	}
	select {
	case s.writer <- struct{}{}:
		defer func() { <-s.writer }()
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, stmt := range []string{"VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)"} {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("sqlstore: scrub free space: %s: %w", stmt, err)
		}
	}
	return nil
}
