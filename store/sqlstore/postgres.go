package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// PostgreSQL error codes sqlstore acts on
// (https://www.postgresql.org/docs/current/errcodes-appendix.html).
const (
	pgSerializationFailure = "40001"
	pgDeadlockDetected     = "40P01"
	pgUniqueViolation      = "23505"
)

// postgresMaxConns caps each Store's connections. Several control-plane
// replicas share one server whose max_connections is 100 by default (three
// replicas fit, with their signal and content connections). A replica's
// write transactions hold 8 (daemon's pgWriteConcurrency) and wait on the
// network between statements, so reads (sessions, authentication, the
// scheduler's pass) need connections of their own: with 10, 5,000
// simulated nodes placed 30,000 runs at 250/s, with 24 at 342/s, same
// session, the machine loaded alike.
const postgresMaxConns = 24

// postgresMaxAttempts is how often Update runs fn before it gives up on
// serialization failures. Under SERIALIZABLE, of two concurrent Updates that
// read and write the same rows one runs again, and nothing queues the
// losers, so a hot row is costly: in the conformance suite's counter (8
// goroutines bumping one row) an Update takes up to about 20 runs. The bound
// is three times that, so that only a livelock ends an Update early; the
// randomized backoff between runs (up to 64ms) spreads the contenders out,
// and the caller's context bounds the time.
const postgresMaxAttempts = 64

// postgresDialect is PostgreSQL through pgx's database/sql driver.
//
// Update runs at SERIALIZABLE and is rerun on a serialization failure
// (SQLSTATE 40001) or a deadlock (40P01), which the store.Store contract
// allows: fn has no effects outside its transaction. Why SERIALIZABLE rather
// than locking:
//   - It is correct for every transaction without knowing what fn reads.
//     SELECT … FOR UPDATE locks only rows that exist, so it cannot protect
//     "create unless a run for this already exists", a ListRuns that
//     decides a placement, or PendingOperations against a concurrent
//     insert; SERIALIZABLE's predicate locks do. Adding FOR UPDATE to each
//     read would also lock rows fn only looks at.
//   - It lets replicas write in parallel. One advisory lock around every
//     Update would be correct too, but would make all replicas' writes one
//     queue (SQLite's model, which is what PostgreSQL is here to remove).
//     Conflicts are rare in the control plane's traffic: most Updates touch
//     one node's or one run's rows.
//
// The cost is a rerun of fn on conflict, bounded by postgresMaxAttempts,
// and some false conflicts (predicate locks are coarser than rows).
//
// View runs READ ONLY at REPEATABLE READ: one snapshot of everything
// committed when its first statement ran, which neither blocks writers nor
// fails with serialization errors (View's fn is not rerun). What a control
// plane replica sees: every Update that returned before the View began, on
// any replica sharing the database. A View may, rarely, see a state that no
// serial order of the concurrent Updates passes through (PostgreSQL's
// read-only anomaly, which only SERIALIZABLE READ ONLY DEFERRABLE avoids, at
// the price of waiting); that is why decisions that write are made inside
// Update, where reads are serializable, and never on what a View saw.
var postgresDialect = &dialect{
	name:       "postgres",
	arrays:     true,
	holdWrites: true,
	driver:     "pgx",
	types: strings.NewReplacer(
		"{{BLOB}}", "BYTEA",
	),
	writeTx: &sql.TxOptions{Isolation: sql.LevelSerializable},
	readTx:  &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true},
	// UpdateLocked: READ COMMITTED, each Get by key FOR UPDATE. Under
	// load, serializable transactions that each read and write dozens of
	// runs (a batch of placements, a node's events) conflicted on the
	// runs' shared index pages (predicate locks are page-grained there)
	// and reran whole: 7,000 reruns in 25 s at 2,000 simulated nodes, 200
	// placements/s. Row locks make such transactions wait only for
	// another holding the same row.
	lockingTx: &sql.TxOptions{Isolation: sql.LevelReadCommitted},
	// READ COMMITTED, so that each statement after the lock sees what the
	// previous holder committed; a REPEATABLE READ or SERIALIZABLE snapshot
	// would be taken by the lock statement itself, before the lock is
	// granted. The lock is per schema (current_schema()), so stores in
	// different schemas of one database migrate independently.
	migrateTx:        &sql.TxOptions{Isolation: sql.LevelReadCommitted},
	lockMigrations:   `SELECT pg_advisory_xact_lock(hashtext('mercator/sqlstore/migrate'), hashtext(COALESCE(current_schema(), '')))`,
	serializeWriters: false,
	maxAttempts:      postgresMaxAttempts,
	retryable: func(err error) bool {
		code := pgCode(err)
		return code == pgSerializationFailure || code == pgDeadlockDetected
	},
	uniqueViolation: func(err error) bool {
		return pgCode(err) == pgUniqueViolation
	},
	textIsUTF8: true,
}

func pgCode(err error) string {
	var e *pgconn.PgError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// IsPostgres reports whether dsn names a PostgreSQL database
// (postgres:// or postgresql://).
func IsPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// openPostgres opens the PostgreSQL database dsn names (a postgres:// or
// postgresql:// URL in libpq's form, parameters included) and migrates the
// schema its search_path selects first.
func openPostgres(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx redacts the password from the URL it quotes, but not from
		// net/url's error it appends, which quotes the URL whole.
		msg := err.Error()
		if pw := dsnPassword(dsn); pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
		return nil, fmt.Errorf("sqlstore: %s", msg)
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(postgresMaxConns)
	db.SetMaxIdleConns(postgresMaxConns)
	// Recycle connections now and then, so a replica follows a failover
	// or a pgbouncer reconfiguration without a restart.
	db.SetConnMaxLifetime(30 * time.Minute)
	db.SetConnMaxIdleTime(5 * time.Minute)
	s := &Store{db: db, d: postgresDialect, writer: make(chan struct{}, 1)}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlstore: connect to %s: %w", Redacted(dsn), err)
	}
	if err := migrate(ctx, db, postgresDialect, migrations); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Redacted returns dsn fit for a log line or an error message: a
// PostgreSQL URL's password is replaced by "xxxxx", even in a URL that does
// not parse; anything else is returned unchanged.
func Redacted(dsn string) string {
	if !IsPostgres(dsn) {
		return dsn
	}
	if u, err := url.Parse(dsn); err == nil {
		return u.Redacted()
	}
	pw := dsnPassword(dsn)
	if pw == "" {
		return dsn
	}
	return strings.Replace(dsn, ":"+pw+"@", ":xxxxx@", 1)
}

// dsnPassword is the password in a PostgreSQL URL's user information, as
// written (not unescaped), or "". It does not need the URL to parse.
func dsnPassword(dsn string) string {
	_, rest, _ := strings.Cut(dsn, "://")
	i := strings.LastIndex(rest, "@")
	if i < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:i], ":")
	return pw
}
