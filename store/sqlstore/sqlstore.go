// Package sqlstore is the store.Store of a SQL database: SQLite, embedded
// through the pure-Go driver modernc.org/sqlite, is the default for one
// control-plane process; PostgreSQL, through pgx's database/sql driver, is
// the production store that several control-plane replicas share. The
// queries are written once for both; what differs (a column type, how
// transactions are isolated and retried, error codes) is a dialect value.
//
// Records are JSON documents in a doc column, beside the few columns the
// queries filter and sort on, so that adding a field to a record needs no
// migration. The schema is versioned by an ordered list of migrations
// recorded in the schema_migrations table; Open applies the missing ones and
// refuses a database migrated by a newer binary (ErrSchemaTooNew).
//
// Only the control plane imports sqlstore (cmd wires it in; tests of other
// packages use memstore).
package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/mercator/mercator/store"
)

// busyTimeout is how long a SQLite connection waits for a lock another
// connection holds before failing with SQLITE_BUSY, after which Update
// retries. In one process writers queue on Store.writer instead, so this
// only matters when another process has the file open (a backup, the CLI).
const busyTimeout = 5 * time.Second

// Store is a store.Store over a SQL database. Safe for concurrent use.
//
// Update is serializable. With SQLite every write transaction begins with
// BEGIN IMMEDIATE, which takes the database's single write lock before the
// first read, so no two read-modify-write transactions interleave, in this
// process or any other. With PostgreSQL write transactions run at
// SERIALIZABLE and run again when the database reports a serialization
// failure (see postgresDialect for why that rather than locks). View runs a
// read transaction that sees one consistent snapshot and neither blocks nor
// is blocked by writers (SQLite in WAL mode; PostgreSQL at REPEATABLE READ).
type Store struct {
	db *sql.DB
	d  *dialect
	// writer is a one-slot semaphore held around each write transaction
	// when d.serializeWriters; a channel rather than a mutex so that a
	// waiting Update gives up when its context ends.
	writer chan struct{}
	// stmts caches prepared statements (SQLite only; see stmtCache).
	stmts *stmtCache
}

// Open opens the database dsn names and brings its schema up to date.
//
// dsn is a PostgreSQL URL, "postgres://USER:PASSWORD@HOST[:PORT]/DB?PARAMS"
// (or postgresql://), in libpq's form: PARAMS such as sslmode and
// search_path are passed on, and the first schema of search_path holds the
// tables (public by default). The database and schema must exist and the
// role must be allowed to create tables there on the first Open, which
// creates them. Every replica of a control plane opens the same dsn.
// Durability is the server's: leave synchronous_commit on (the default),
// for the reason given for SQLite below. Redacted makes a dsn fit for a log.
//
// Otherwise dsn is "sqlite://PATH" or a bare PATH: an SQLite file, created
// with its parent directory if missing. PATH may not contain '?' or '#',
// and an in-memory database (":memory:") is refused because each pooled
// connection would get its own; use memstore for that.
//
// The SQLite file is put in WAL mode with synchronous=FULL. FULL rather than
// NORMAL: in WAL mode NORMAL survives a crash of the process but may lose
// the last commits on power loss, and a commit this store acknowledged may
// be a node's new fencing token or an accepted event, which the promises in
// DESIGN.md rely on never being forgotten once the node was told. The cost
// is one fsync of the WAL per commit.
//
// Open fails with an error wrapping ErrSchemaTooNew when the database was
// migrated by a newer binary.
func Open(ctx context.Context, dsn string) (*Store, error) {
	if IsPostgres(dsn) {
		return openPostgres(ctx, dsn)
	}
	d, path, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("sqlstore: create the database's directory: %w", err)
	}
	db, err := sql.Open(d.driver, sqliteDSN(path))
	if err != nil {
		return nil, fmt.Errorf("sqlstore: open %s: %w", path, err)
	}
	// SQLite connections are cheap and readers run in parallel under WAL;
	// the cap bounds memory (each connection has its own page cache).
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	s := &Store{db: db, d: d, writer: make(chan struct{}, 1), stmts: newStmtCache(db)}
	if err := s.checkSQLite(ctx, path); err != nil {
		db.Close()
		return nil, err
	}
	if err := migrate(ctx, db, d, migrations); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// parseDSN parses an SQLite dsn (Open has already dispatched PostgreSQL's)
// into its dialect and absolute path.
func parseDSN(dsn string) (*dialect, string, error) {
	path := dsn
	if rest, ok := strings.CutPrefix(dsn, "sqlite://"); ok {
		path = rest
	} else if scheme, _, ok := strings.Cut(dsn, "://"); ok {
		return nil, "", fmt.Errorf("sqlstore: unsupported database %q in %q: sqlite://, postgres:// and postgresql:// are", scheme, Redacted(dsn))
	}
	switch {
	case path == "":
		return nil, "", fmt.Errorf("sqlstore: no database path in %q", dsn)
	case path == ":memory:" || strings.HasPrefix(path, "file:"):
		return nil, "", fmt.Errorf("sqlstore: %q is not a file path (for an in-memory store use memstore)", dsn)
	case strings.ContainsAny(path, "?#"):
		return nil, "", fmt.Errorf("sqlstore: database path %q contains '?' or '#'", path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, "", fmt.Errorf("sqlstore: database path %q: %w", path, err)
	}
	return sqliteDialect, abs, nil
}

// sqliteDSN is the modernc.org/sqlite DSN for path. The parameters apply to
// every connection the pool opens.
func sqliteDSN(path string) string {
	q := url.Values{}
	// BEGIN IMMEDIATE for every transaction that is not read-only: the
	// write lock is taken before fn's first read, so a read-modify-write
	// cannot interleave with another writer's (and cannot fail late with
	// SQLITE_BUSY_SNAPSHOT when upgrading a read lock).
	q.Set("_txlock", "immediate")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)") // see Open for why FULL
	q.Add("_pragma", "foreign_keys(1)")
	// A page cache of up to 32 MiB a connection (SQLite's default is 2
	// MiB): once the runs, operations and event records outgrow the
	// default, every lookup by key becomes reads from the file, and a
	// control plane placing a hundred thousand runs slowed by a quarter.
	// Pages are cached as they are read, so a small store holds little.
	q.Add("_pragma", "cache_size(-32768)")
	return path + "?" + q.Encode()
}

// checkSQLite verifies that the connection settings took effect: a file
// system without shared memory support, for one, silently keeps the
// rollback journal.
func (s *Store) checkSQLite(ctx context.Context, path string) error {
	want := map[string]string{"journal_mode": "wal", "synchronous": "2", "foreign_keys": "1", "cache_size": "-32768"}
	for pragma, v := range want {
		var got string
		if err := s.db.QueryRowContext(ctx, "PRAGMA "+pragma).Scan(&got); err != nil {
			return fmt.Errorf("sqlstore: open %s: %w", path, err)
		}
		if !strings.EqualFold(got, v) {
			return fmt.Errorf("sqlstore: open %s: PRAGMA %s is %q, want %q", path, pragma, got, v)
		}
	}
	return nil
}

// Update implements store.Store: fn runs in one write transaction, which
// commits if fn returns nil. When the database reports a conflict that
// running again may resolve (SQLite: a lock held elsewhere past the busy
// timeout; PostgreSQL: a serialization failure or a deadlock), the
// transaction is rolled back and fn runs again, up to the dialect's
// maxAttempts, with a short randomized backoff. A conflict counts even when
// fn swallowed the error a Tx method returned for it, since whatever fn
// decided after that was decided on a failed transaction. Otherwise fn's
// own error is returned unwrapped.
func (s *Store) Update(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.retrying(ctx, fn, false)
}

// UpdateLocked implements store.UpdateLocked. With SQLite it is Update (one
// writer at a time already). With PostgreSQL the transaction runs at READ
// COMMITTED and every Get in it reads with FOR UPDATE, which waits for and
// then holds the row's lock; a deadlock between two such transactions is
// retried as a conflict is.
func (s *Store) UpdateLocked(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.retrying(ctx, fn, s.d.lockingTx != nil)
}

// retrying runs fn with update until it commits, fails for a reason other
// than a conflict, or has run maxAttempts times.
func (s *Store) retrying(ctx context.Context, fn func(tx store.Tx) error, lockRows bool) error {
	for attempt := 1; ; attempt++ {
		conflict, err := s.update(ctx, fn, lockRows)
		if err == nil || !conflict || attempt >= s.d.maxAttempts {
			return err
		}
		backoff := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))
		timer := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			timer.Stop()
			return err
		case <-timer.C:
		}
	}
}

// update runs fn once. conflict reports that err, or an error a statement
// inside fn met, is retryable.
func (s *Store) update(ctx context.Context, fn func(tx store.Tx) error, lockRows bool) (conflict bool, err error) {
	if s.d.serializeWriters {
		select {
		case s.writer <- struct{}{}:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		defer func() { <-s.writer }()
	}
	opts := s.d.writeTx
	if lockRows {
		opts = s.d.lockingTx
	}
	sqlTx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return s.d.retryable(err), fmt.Errorf("sqlstore: begin: %w", err)
	}
	stmtCtx := ctx
	if s.d.serializeWriters {
		// SQLite's statements run without ctx's cancellation: with a
		// cancellable context modernc's driver starts a goroutine and
		// installs a progress handler for every statement, a measurable
		// share of the one writer's time, to interrupt statements that are
		// short anyway. ctx still ends the transaction between statements
		// (database/sql rolls it back when ctx is done) and bounds the wait
		// for the writer above.
		stmtCtx = context.WithoutCancel(ctx)
	}
	t := &txn{ctx: stmtCtx, tx: sqlTx, d: s.d, write: true, lockRows: lockRows, stmts: s.stmts}
	if lockRows && s.d.holdWrites {
		t.held = &held{tables: map[string]bool{}}
	}
	committed := false
	defer func() {
		t.done = true
		if !committed {
			_ = sqlTx.Rollback()
		}
	}()
	if err := fn(t); err != nil {
		if t.held != nil && t.held.err != nil {
			// A send of held writes failed and aborted the transaction:
			// what fn met after it was only that.
			err = t.held.err
		}
		return t.conflict != nil || s.d.retryable(err), err
	}
	if err := t.sendHeld(true); err != nil {
		return t.conflict != nil || s.d.retryable(err), err
	}
	t.done = true
	if err := sqlTx.Commit(); err != nil {
		return t.conflict != nil || s.d.retryable(err), fmt.Errorf("sqlstore: commit: %w", err)
	}
	committed = true
	return false, nil
}

// View implements store.Store: fn runs in a read-only transaction that sees
// one consistent snapshot. Writes inside fn fail. fn's error is returned
// unwrapped.
func (s *Store) View(ctx context.Context, fn func(tx store.Tx) error) error {
	sqlTx, err := s.db.BeginTx(ctx, s.d.readTx)
	if err != nil {
		return fmt.Errorf("sqlstore: begin: %w", err)
	}
	t := &txn{ctx: ctx, tx: sqlTx, d: s.d, stmts: s.stmts}
	defer func() {
		t.done = true
		_ = sqlTx.Rollback()
	}()
	return fn(t)
}

// Close closes the database. Call it once every Update and View has
// returned; Update and View fail afterwards.
func (s *Store) Close() error {
	s.stmts.close()
	return s.db.Close()
}

var _ store.Store = (*Store)(nil)
