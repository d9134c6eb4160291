package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/storetest"
)

func TestConformance(t *testing.T) {
	var mu sync.Mutex
	paths := map[store.Store]string{}
	open := func(t *testing.T) store.Store {
		path := filepath.Join(t.TempDir(), "state", "mercator.db")
		s, err := Open(t.Context(), "sqlite://"+path)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		paths[s] = path
		mu.Unlock()
		return s
	}
	storetest.RunWithOptions(t, open, storetest.Options{
		WriteDocument: writeDocument,
		Reopen: func(t *testing.T, closed store.Store) store.Store {
			mu.Lock()
			path := paths[closed]
			mu.Unlock()
			s, err := Open(t.Context(), path) // a bare path this time
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mercator.db")
	s, err := Open(t.Context(), "sqlite://"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

type appliedMigration struct {
	version   int
	name      string
	appliedAt string
}

func applied(t *testing.T, db *sql.DB) []appliedMigration {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), `SELECT version, name, applied_at FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []appliedMigration
	for rows.Next() {
		var m appliedMigration
		if err := rows.Scan(&m.version, &m.name, &m.appliedAt); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMigrationsAreNumberedInOrder(t *testing.T) {
	if len(migrations) == 0 {
		t.Fatal("no migrations")
	}
	for i, m := range migrations {
		if m.version != i+1 || m.name == "" || len(m.stmts) == 0 {
			t.Errorf("migration %d = version %d %q with %d statements", i, m.version, m.name, len(m.stmts))
		}
	}
}

func TestMigrateFreshAndReopen(t *testing.T) {
	forEachDB(t, func(t *testing.T, tdb testDB) {
		s, dsn := tdb.open(t)
		first := applied(t, s.db)
		if len(first) != len(migrations) {
			t.Fatalf("a fresh database recorded %d migrations, want %d", len(first), len(migrations))
		}
		for i, m := range first {
			if m.version != migrations[i].version || m.name != migrations[i].name || m.appliedAt == "" {
				t.Errorf("recorded migration %d = %+v", i, m)
			}
		}
		for _, table := range []string{"nodes", "invitations", "sessions", "runs", "run_nodes", "operations", "events", "log_chunks", "tokens"} {
			if n, err := tableCount(t, s, table); err != nil || n != 1 {
				t.Errorf("table %s: count %d, err %v", table, n, err)
			}
		}
		if err := s.Update(t.Context(), func(tx store.Tx) error { return tx.CreateToken(store.Token{Hash: "h", Name: "kept"}) }); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}

		// Reopening applies nothing and keeps the data.
		s2, err := Open(t.Context(), tdb.reopenDSN(dsn))
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		if again := applied(t, s2.db); !slices.Equal(again, first) {
			t.Errorf("reopening changed schema_migrations:\n got  %+v\n want %+v", again, first)
		}
		err = s2.View(t.Context(), func(tx store.Tx) error {
			tok, err := tx.GetToken("h")
			if err == nil && tok.Name != "kept" {
				err = fmt.Errorf("token name %q", tok.Name)
			}
			return err
		})
		if err != nil {
			t.Errorf("data after reopening: %v", err)
		}
	})
}

func TestMigrateRefusesNewerSchema(t *testing.T) {
	forEachDB(t, func(t *testing.T, tdb testDB) {
		s, dsn := tdb.open(t)
		future := len(migrations) + 1
		if _, err := s.db.ExecContext(t.Context(),
			`INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, 'from the future', 'x')`, future); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		_, err := Open(t.Context(), tdb.reopenDSN(dsn))
		if !errors.Is(err, ErrSchemaTooNew) {
			t.Fatalf("Open of a newer schema = %v, want ErrSchemaTooNew", err)
		}
		for _, want := range []string{strconv.Itoa(future), strconv.Itoa(len(migrations))} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say version %s", err, want)
			}
		}
	})
}

func TestMigrateFailureKeepsNothing(t *testing.T) {
	forEachDB(t, func(t *testing.T, tdb testDB) {
		s, _ := tdb.open(t)
		before := applied(t, s.db)
		next := len(migrations) + 1
		bad := append(slices.Clone(migrations), migration{
			version: next,
			name:    "broken",
			stmts: []string{
				`CREATE TABLE half_done (id TEXT PRIMARY KEY)`,
				`THIS IS NOT SQL`,
			},
		})
		err := migrate(t.Context(), s.db, s.d, bad)
		if err == nil || !strings.Contains(err.Error(), "broken") {
			t.Fatalf("migrate with a broken migration = %v, want an error naming it", err)
		}
		if got := applied(t, s.db); !slices.Equal(got, before) {
			t.Errorf("a failed migration was recorded: %+v", got)
		}
		if n, err := tableCount(t, s, "half_done"); err != nil || n != 0 {
			t.Errorf("a failed migration's first statement was kept (count %d, err %v)", n, err)
		}

		// A later migration list is applied on top of the current one.
		good := append(slices.Clone(migrations), migration{
			version: next, name: "added later",
			stmts: []string{`CREATE TABLE added_later (id TEXT PRIMARY KEY)`},
		})
		if err := migrate(t.Context(), s.db, s.d, good); err != nil {
			t.Fatal(err)
		}
		got := applied(t, s.db)
		if len(got) != next || got[next-1].name != "added later" {
			t.Errorf("after adding a migration: %+v", got)
		}
		// And misnumbered lists are refused before touching the database.
		if err := migrate(t.Context(), s.db, s.d, []migration{{version: 2, name: "skips 1"}}); err == nil {
			t.Error("migrate accepted a list that does not start at 1")
		}
	})
}

func TestConnectionSettings(t *testing.T) {
	s, _ := openTemp(t)
	// Hold several connections at once so more than one is checked.
	ctx := t.Context()
	var conns []*sql.Conn
	for range 3 {
		c, err := s.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		for pragma, want := range map[string]string{
			"journal_mode": "wal",
			"synchronous":  "2", // FULL
			"foreign_keys": "1",
			"busy_timeout": strconv.Itoa(int(busyTimeout.Milliseconds())),
		} {
			var got string
			if err := c.QueryRowContext(ctx, "PRAGMA "+pragma).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("connection %d: PRAGMA %s = %q, want %q", i, pragma, got, want)
			}
		}
		c.Close()
	}
}

// rawDB opens path without the store's settings and without a busy
// timeout, so that a lock held elsewhere fails at once.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

// TestWriteTransactionsBeginImmediate checks that an Update holds the
// write lock from its start, before it has read or written anything: what
// makes a read-modify-write serializable across connections and processes.
func TestWriteTransactionsBeginImmediate(t *testing.T) {
	s, path := openTemp(t)
	other := rawDB(t, path)
	ctx := t.Context()
	var busyErr error
	err := s.Update(ctx, func(store.Tx) error {
		_, busyErr = other.ExecContext(ctx, `BEGIN IMMEDIATE`)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if busyErr == nil {
		t.Fatal("another connection took the write lock while an Update had begun")
	}
	if !sqliteDialect.retryable(busyErr) {
		t.Errorf("the lock error %v is not retryable", busyErr)
	}
	// A View takes no write lock.
	err = s.View(ctx, func(tx store.Tx) error {
		if _, err := tx.ListNodes(); err != nil {
			return err
		}
		if _, err := other.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
			return fmt.Errorf("a View blocked a writer: %w", err)
		}
		_, err := other.ExecContext(ctx, `ROLLBACK`)
		return err
	})
	if err != nil {
		t.Error(err)
	}
}

// TestUpdateWaitsForAnotherProcess: while another connection holds the
// write lock, an Update waits (busy_timeout, then retries) rather than
// failing at once, gives up when its context ends, and goes through once the
// lock is released.
func TestUpdateWaitsForAnotherProcess(t *testing.T) {
	s, path := openTemp(t)
	other := rawDB(t, path)
	ctx := t.Context()
	if _, err := other.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	called := false
	err := s.Update(short, func(tx store.Tx) error { called = true; return nil })
	if !errors.Is(err, context.DeadlineExceeded) || called {
		t.Fatalf("Update while the lock is held elsewhere = %v (fn called: %v), want it to wait out its context", err, called)
	}
	done := make(chan error, 1)
	go func() {
		done <- s.Update(ctx, func(tx store.Tx) error { return tx.PutNode(store.Node{ID: "node-a"}) })
	}()
	if _, err := other.ExecContext(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Update after the lock was released: %v", err)
	}
}

// TestTwoStoresOneFile: two Stores on one file (as two processes would be)
// do not share the in-process writer queue, so the database's own locking
// is what keeps their read-modify-writes from losing increments.
func TestTwoStoresOneFile(t *testing.T) {
	a, path := openTemp(t)
	b, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := t.Context()
	if err := a.Update(ctx, func(tx store.Tx) error { return tx.PutNode(store.Node{ID: "counter"}) }); err != nil {
		t.Fatal(err)
	}
	const perGoroutine = 25
	var wg sync.WaitGroup
	for _, s := range []*Store{a, b, a, b} {
		wg.Go(func() {
			for range perGoroutine {
				err := s.Update(ctx, func(tx store.Tx) error {
					n, err := tx.GetNode("counter")
					if err != nil {
						return err
					}
					n.FencingToken++
					return tx.PutNode(n)
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	err = b.View(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode("counter")
		if err == nil && n.FencingToken != 4*perGoroutine {
			err = fmt.Errorf("counter = %d, want %d", n.FencingToken, 4*perGoroutine)
		}
		return err
	})
	if err != nil {
		t.Error(err)
	}
}

func TestUniqueViolationIsConflict(t *testing.T) {
	s, path := openTemp(t)
	// The create paths use ON CONFLICT DO NOTHING; a constraint error from
	// any other statement is translated too.
	err := s.Update(t.Context(), func(x store.Tx) error {
		tx := x.(*txn)
		insert := `INSERT INTO tokens (hash, doc) VALUES ('h', '{}')`
		if _, err := tx.exec("create", "token", "h", insert); err != nil {
			return err
		}
		_, err := tx.exec("create", "token", "h", insert)
		if !errors.Is(err, failure.ErrConflict) || !strings.Contains(err.Error(), `"h"`) || !strings.Contains(err.Error(), "UNIQUE") {
			t.Errorf("duplicate insert = %v, want a conflict naming the token and the database's reason", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = rawDB(t, path).ExecContext(t.Context(), `INSERT INTO tokens (hash, doc) VALUES ('h', '{}')`)
	if err == nil || !sqliteDialect.uniqueViolation(err) {
		t.Errorf("uniqueViolation(%v) = false", err)
	}
	if sqliteDialect.uniqueViolation(errors.New("UNIQUE constraint failed")) {
		t.Error("uniqueViolation matched a message rather than a code")
	}
}

// TestLogStoresOnlyNewBytes: a redelivered or overlapping chunk adds only
// what the log lacked, as one row, so an append costs the chunk, not the log.
func TestLogStoresOnlyNewBytes(t *testing.T) {
	s, _ := openTemp(t)
	k := nodeproto.WorkloadKey{RunID: "run-1", Attempt: 1}
	err := s.Update(t.Context(), func(tx store.Tx) error {
		for _, c := range []struct {
			off  int64
			data string
		}{{0, "abc"}, {0, "abc"}, {1, "bcdef"}, {6, ""}, {2, "c"}, {9, "gh"}} {
			if _, err := tx.AppendLog(k, c.off, []byte(c.data)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := s.db.QueryContext(t.Context(), `SELECT start_offset, end_offset, data FROM log_chunks ORDER BY start_offset`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var start, end int64
		var data []byte
		if err := rows.Scan(&start, &end, &data); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d-%d:%s", start, end, data))
	}
	want := []string{"0-3:abc", "3-6:def", "6-8:gh"}
	if !slices.Equal(got, want) {
		t.Errorf("chunks = %q, want %q", got, want)
	}
}

func TestParseDSN(t *testing.T) {
	dir := t.TempDir()
	for _, dsn := range []string{"sqlite://" + dir + "/a.db", dir + "/b.db", "sqlite://" + dir + "/nested/deeper/c.db"} {
		d, path, err := parseDSN(dsn)
		if err != nil || d != sqliteDialect || !filepath.IsAbs(path) || !strings.HasSuffix(dsn, strings.TrimPrefix(path, dir)) {
			t.Errorf("parseDSN(%q) = %v, %q, %v", dsn, d, path, err)
		}
	}
	t.Chdir(dir)
	_, path, err := parseDSN("sqlite://rel/d.db")
	if err != nil || path != filepath.Join(dir, "rel", "d.db") {
		t.Errorf("relative path: %q, %v", path, err)
	}
	for _, dsn := range []string{"", "sqlite://", ":memory:", "sqlite://:memory:", "file:x.db", "postgres://db/mercator", dir + "/x.db?mode=ro", "x#y"} {
		if _, _, err := parseDSN(dsn); err == nil {
			t.Errorf("parseDSN(%q) succeeded", dsn)
		}
	}
	// Open creates the parent directory.
	s, err := Open(t.Context(), "sqlite://"+filepath.Join(dir, "new", "dir", "m.db"))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, "new", "dir", "m.db")); err != nil {
		t.Error(err)
	}
}

// TestStatementsArePrepared: a query used again runs from a prepared
// statement (SQLite parses a query's text at every use otherwise), and
// while the connection pool is exhausted by transactions a miss still
// answers: preparing never waits for a connection inside a transaction.
func TestStatementsArePrepared(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	put := func(id string) {
		t.Helper()
		if err := s.Update(ctx, func(tx store.Tx) error {
			return tx.CreateRun(store.Run{Run: api.Run{ID: id, Status: api.RunQueued}})
		}); err != nil {
			t.Fatal(err)
		}
	}
	put("r1")
	deadline := time.Now().Add(time.Minute)
	for {
		s.stmts.mu.Lock()
		n, pending := len(s.stmts.m), len(s.stmts.pending)
		s.stmts.mu.Unlock()
		if n > 0 && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no statement prepared after a write (cached %d, pending %d)", n, pending)
		}
		time.Sleep(time.Millisecond)
	}
	put("r2") // through the prepared statement now
	// Every connection held by a read transaction, each running a query
	// not yet prepared: each must still be answered.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	start := make(chan struct{})
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.View(ctx, func(tx store.Tx) error {
				<-start
				runs, err := tx.ListRuns(store.ListRunsOptions{Statuses: []string{api.RunQueued}})
				if err == nil && len(runs) != 2 {
					err = fmt.Errorf("listed %d runs, want 2", len(runs))
				}
				return err
			})
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got, err := getRun(s, "r2"); err != nil || got.ID != "r2" {
		t.Errorf("run r2 after a prepared write = %+v, %v", got, err)
	}
}

func getRun(s *Store, id string) (store.Run, error) {
	var r store.Run
	err := s.View(context.Background(), func(tx store.Tx) error {
		var err error
		r, err = tx.GetRun(id)
		return err
	})
	return r, err
}
