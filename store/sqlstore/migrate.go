package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ErrSchemaTooNew is wrapped by Open's error when the database was migrated
// by a newer Mercator than this one: opening it could misread or damage
// data this binary does not understand, so Open refuses. Upgrade the binary.
var ErrSchemaTooNew = errors.New("database schema is newer than this binary")

// A migration moves the schema from version-1 to version. Migrations are
// applied in order, never edited once released, and never removed: a later
// schema change is a new migration appended to the list.
type migration struct {
	version int
	name    string
	// stmts run in order. {{…}} placeholders are replaced by the
	// dialect's types.
	stmts []string
	// backfill, when set, runs after stmts in the same transaction: it
	// derives new columns from the documents already stored, which SQL
	// common to both databases cannot read.
	backfill func(ctx context.Context, tx *sql.Tx) error
}

// migrations is the schema's history. Records are JSON documents in doc
// columns; the other columns exist only to be indexed or filtered on, and
// are derived from the document on every write.
//
// Times that are sorted on are split into Unix seconds and nanoseconds:
// exact, ordered by instant whatever the zone, and the same in every
// database (a text column would sort by collation).
var migrations = []migration{
	{
		version: 1,
		name:    "initial schema",
		stmts: []string{
			`CREATE TABLE nodes (
				id TEXT PRIMARY KEY,
				doc TEXT NOT NULL
			)`,
			`CREATE TABLE invitations (
				token_hash TEXT PRIMARY KEY,
				node_id TEXT NOT NULL,
				doc TEXT NOT NULL
			)`,
			`CREATE TABLE sessions (
				token_hash TEXT PRIMARY KEY,
				node_id TEXT NOT NULL,
				doc TEXT NOT NULL
			)`,
			`CREATE INDEX sessions_by_node ON sessions (node_id)`,
			`CREATE TABLE runs (
				id TEXT PRIMARY KEY,
				created_sec BIGINT NOT NULL,
				created_nsec BIGINT NOT NULL,
				status TEXT NOT NULL,
				doc TEXT NOT NULL
			)`,
			`CREATE INDEX runs_by_created ON runs (created_sec, created_nsec, id)`,
			`CREATE INDEX runs_by_status ON runs (status, created_sec, created_nsec, id)`,
			// run_nodes holds one row per node a run has an attempt on,
			// for ListRunsOptions.NodeID.
			`CREATE TABLE run_nodes (
				run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
				node_id TEXT NOT NULL,
				PRIMARY KEY (run_id, node_id)
			)`,
			`CREATE INDEX run_nodes_by_node ON run_nodes (node_id, run_id)`,
			`CREATE TABLE operations (
				id TEXT PRIMARY KEY,
				node_id TEXT NOT NULL,
				pending INTEGER NOT NULL,
				created_sec BIGINT NOT NULL,
				created_nsec BIGINT NOT NULL,
				doc TEXT NOT NULL
			)`,
			`CREATE INDEX operations_pending ON operations (node_id, pending, created_sec, created_nsec, id)`,
			`CREATE TABLE events (
				node_id TEXT NOT NULL,
				event_id TEXT NOT NULL,
				seen_at TEXT NOT NULL,
				PRIMARY KEY (node_id, event_id)
			)`,
			// A log is the chunks of its appends, contiguous and
			// non-overlapping: [start_offset, end_offset) each. Appending
			// writes one row (O(chunk), never rewriting the log), the size
			// is the end of the last chunk, and a read fetches only the
			// chunks it overlaps, through the primary key.
			`CREATE TABLE log_chunks (
				run_id TEXT NOT NULL,
				attempt BIGINT NOT NULL,
				start_offset BIGINT NOT NULL,
				end_offset BIGINT NOT NULL,
				data {{BLOB}} NOT NULL,
				PRIMARY KEY (run_id, attempt, start_offset)
			)`,
			`CREATE TABLE tokens (
				hash TEXT PRIMARY KEY,
				doc TEXT NOT NULL
			)`,
		},
	},
	{
		version: 2,
		name:    "artifact catalog and registry credentials",
		stmts: []string{
			`CREATE TABLE artifacts (
				name TEXT NOT NULL,
				version TEXT NOT NULL,
				seq BIGINT NOT NULL,
				doc TEXT NOT NULL,
				PRIMARY KEY (name, version)
			)`,
			`CREATE INDEX artifacts_by_seq ON artifacts (name, seq, version)`,
			// doc holds the password sealed by the control plane, never
			// in the clear.
			`CREATE TABLE registry_credentials (
				host TEXT PRIMARY KEY,
				doc TEXT NOT NULL
			)`,
		},
	},
	{
		version: 3,
		name:    "functions: apps, fns, triggers, durable calls",
		stmts:   functionsMigration, // in functions.go
	},
	{
		version: 4,
		name:    "audit log",
		stmts:   accessMigration, // in access.go
	},
	{
		version:  5,
		name:     "retention: finished, expiry and event sequence columns, event watermarks",
		stmts:    retentionMigration, // in retention.go
		backfill: retentionBackfill,
	},
	{
		version: 6,
		name:    "scheduling epoch: placements fenced by the database",
		stmts:   epochMigration, // in epoch.go
	},
	{
		version:  7,
		name:     "node liveness in a column of its own",
		stmts:    liveMigration, // in nodes.go
		backfill: liveBackfill,
	},
	{
		version: 8,
		name:    "projects, and the runs' project column",
		stmts:   projectsMigration, // in projects.go
	},
	{
		version: 9,
		name:    "agent releases and rollouts",
		stmts:   upgradesMigration, // in upgrades.go
	},
	{
		version: 10,
		name:    "registry credentials by project",
		stmts:   registryProjectsMigration, // in artifacts.go
	},
	{
		// Every invitation and every enrollment revokes the node's other
		// unused invitations, a lookup by node; without this index it read
		// every invitation, so inviting and enrolling a fleet was
		// quadratic (50,000 nodes: the invitations alone took minutes).
		version: 11,
		name:    "invitations indexed by node",
		stmts:   []string{`CREATE INDEX invitations_by_node ON invitations (node_id)`},
	},
	{
		version: 12,
		name:    "node record versions",
		stmts:   revMigration, // in nodes.go
	},
	{
		version: 13,
		name:    "node liveness apart from the record",
		stmts:   seenMigration, // in nodes.go
	},
}

// migrate brings db's schema up to the last of ms, in one write
// transaction, so that a crash leaves the schema at a released version
// (PostgreSQL's DDL is transactional, as SQLite's is), and two processes
// opening a new database cannot both migrate it (see
// dialect.lockMigrations). It refuses a database whose recorded version is
// beyond ms.
func migrate(ctx context.Context, db *sql.DB, d *dialect, ms []migration) error {
	for i, m := range ms {
		if m.version != i+1 {
			return fmt.Errorf("sqlstore: migration %q has version %d, want %d", m.name, m.version, i+1)
		}
	}
	tx, err := db.BeginTx(ctx, d.migrateTx)
	if err != nil {
		return fmt.Errorf("sqlstore: migrate: begin: %w", err)
	}
	defer tx.Rollback()
	if d.lockMigrations != "" {
		if _, err := tx.ExecContext(ctx, d.lockMigrations); err != nil {
			return fmt.Errorf("sqlstore: migrate: lock: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version BIGINT PRIMARY KEY,
		name TEXT NOT NULL,
		applied_at TEXT NOT NULL
	)`); err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	var current int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return fmt.Errorf("sqlstore: migrate: read schema version: %w", err)
	}
	if current > len(ms) {
		return fmt.Errorf("sqlstore: %w: the database is at schema version %d and this binary knows versions up to %d; run a newer mercator",
			ErrSchemaTooNew, current, len(ms))
	}
	for _, m := range ms[current:] {
		for _, stmt := range m.stmts {
			if _, err := tx.ExecContext(ctx, d.types.Replace(stmt)); err != nil {
				return fmt.Errorf("sqlstore: migration %d (%s): %w", m.version, m.name, err)
			}
		}
		if m.backfill != nil {
			if err := m.backfill(ctx, tx); err != nil {
				return fmt.Errorf("sqlstore: migration %d (%s): %w", m.version, m.name, err)
			}
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
			m.version, m.name, time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
			return fmt.Errorf("sqlstore: migration %d (%s): record: %w", m.version, m.name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlstore: migrate: commit: %w", err)
	}
	return nil
}
