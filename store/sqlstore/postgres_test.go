package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/pgtest"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/storetest"
)

// TestConformancePostgres runs the conformance suite against PostgreSQL,
// each subtest in a schema of its own.
func TestConformancePostgres(t *testing.T) {
	pgtest.DSN(t) // skip or fail before the suite's subtests each do
	var mu sync.Mutex
	dsns := map[store.Store]string{}
	open := func(t *testing.T) store.Store {
		dsn := pgtest.FreshSchema(t)
		s, err := Open(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		dsns[s] = dsn
		mu.Unlock()
		return s
	}
	storetest.RunWithOptions(t, open, storetest.Options{
		WriteDocument: writeDocument,
		Reopen: func(t *testing.T, closed store.Store) store.Store {
			mu.Lock()
			dsn := dsns[closed]
			mu.Unlock()
			s, err := Open(t.Context(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

// TestPostgresTwoReplicas: two Stores on one schema, as two control-plane
// replicas are, lose no increment of a row they both read and write. Nothing
// in-process orders them; SERIALIZABLE and Update's rerun do.
func TestPostgresTwoReplicas(t *testing.T) {
	a, dsn := postgresDB.open(t)
	b, err := Open(t.Context(), dsn)
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
	var runs atomic.Int64
	for _, s := range []*Store{a, b, a, b} {
		wg.Go(func() {
			for range perGoroutine {
				err := s.Update(ctx, func(tx store.Tx) error {
					runs.Add(1)
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
	t.Logf("%d increments took %d runs of fn", 4*perGoroutine, runs.Load())
}

// TestPostgresRerunsAfterSwallowedConflict forces a serialization failure:
// Update A reads a row, Update B changes it and commits, then A writes it.
// A's fn ignores the error its write gets, as careless code might; Update
// must still run it again rather than commit (or report) what it decided on
// a failed transaction.
func TestPostgresRerunsAfterSwallowedConflict(t *testing.T) {
	for _, swallow := range []bool{true, false} {
		t.Run(fmt.Sprintf("swallow=%v", swallow), func(t *testing.T) {
			s, _ := postgresDB.open(t)
			ctx := t.Context()
			bump := func(tx store.Tx) error {
				n, err := tx.GetNode("counter")
				if err != nil {
					return err
				}
				n.FencingToken++
				return tx.PutNode(n)
			}
			if err := s.Update(ctx, func(tx store.Tx) error { return tx.PutNode(store.Node{ID: "counter"}) }); err != nil {
				t.Fatal(err)
			}
			var calls int
			var firstErr error
			err := s.Update(ctx, func(tx store.Tx) error {
				calls++
				n, err := tx.GetNode("counter")
				if err != nil {
					return err
				}
				if calls == 1 {
					// Another replica's Update commits in between.
					if err := s.Update(ctx, bump); err != nil {
						t.Fatalf("the concurrent Update: %v", err)
					}
				}
				n.FencingToken++
				err = tx.PutNode(n)
				if calls == 1 {
					firstErr = err
					if swallow {
						return nil
					}
				}
				return err
			})
			if err != nil {
				t.Fatalf("Update = %v", err)
			}
			if firstErr == nil || !postgresDialect.retryable(firstErr) {
				t.Fatalf("the first run's write = %v, want a serialization failure", firstErr)
			}
			if calls != 2 {
				t.Errorf("fn ran %d times, want 2", calls)
			}
			err = s.View(ctx, func(tx store.Tx) error {
				n, err := tx.GetNode("counter")
				if err == nil && n.FencingToken != 2 {
					err = fmt.Errorf("counter = %d, want 2", n.FencingToken)
				}
				return err
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
}

// TestPostgresGivesUp: a conflict on every run ends after maxAttempts with
// the conflict's error, not a hang.
func TestPostgresGivesUp(t *testing.T) {
	s, _ := postgresDB.open(t)
	d := *postgresDialect
	d.maxAttempts = 5 // the real bound takes seconds of backoff
	s.d = &d
	ctx := t.Context()
	calls := 0
	err := s.Update(ctx, func(store.Tx) error {
		calls++
		return fmt.Errorf("fn: %w", &pgconn.PgError{Code: pgSerializationFailure, Message: "simulated"})
	})
	if !postgresDialect.retryable(err) || calls != d.maxAttempts {
		t.Errorf("Update = %v after %d runs, want the serialization failure after %d", err, calls, d.maxAttempts)
	}
	s.d = postgresDialect
	// A cancelled context stops the reruns early.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	calls = 0
	start := time.Now()
	err = s.Update(short, func(store.Tx) error {
		calls++
		return &pgconn.PgError{Code: pgDeadlockDetected}
	})
	if err == nil || calls >= postgresMaxAttempts || time.Since(start) > 5*time.Second || calls == 0 {
		t.Errorf("Update with a 200ms context ran fn %d times over %v and returned %v", calls, time.Since(start), err)
	}
}

// TestPostgresConcurrentOpen: replicas starting together on an empty schema
// migrate it once; the others find it migrated.
func TestPostgresConcurrentOpen(t *testing.T) {
	dsn := postgresDB.fresh(t)
	const replicas = 6
	stores := make([]*Store, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() { stores[i], errs[i] = Open(t.Context(), dsn) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: Open: %v", i, err)
			continue
		}
		defer stores[i].Close()
	}
	if t.Failed() {
		return
	}
	if got := applied(t, stores[0].db); len(got) != len(migrations) {
		t.Errorf("schema_migrations = %+v, want %d rows", got, len(migrations))
	}
}

// TestPostgresUniqueViolationIsConflict: a constraint error from a statement
// that is not a Create's ON CONFLICT is a conflict too. PostgreSQL aborts the
// transaction on it, so the Update fails as a whole.
func TestPostgresUniqueViolationIsConflict(t *testing.T) {
	s, _ := postgresDB.open(t)
	err := s.Update(t.Context(), func(x store.Tx) error {
		tx := x.(*txn)
		insert := `INSERT INTO tokens (hash, doc) VALUES ('h', '{}')`
		if _, err := tx.exec("create", "token", "h", insert); err != nil {
			return err
		}
		_, err := tx.exec("create", "token", "h", insert)
		if !errors.Is(err, failure.ErrConflict) || !strings.Contains(err.Error(), `"h"`) || !strings.Contains(err.Error(), pgUniqueViolation) {
			t.Errorf("duplicate insert = %v, want a conflict naming the token and the database's reason", err)
		}
		return err
	})
	if !errors.Is(err, failure.ErrConflict) {
		t.Errorf("Update = %v, want the conflict", err)
	}
	if postgresDialect.uniqueViolation(errors.New("duplicate key value violates unique constraint")) {
		t.Error("uniqueViolation matched a message rather than a code")
	}
}

// TestPostgresUnstorableKeys: keys PostgreSQL's TEXT cannot hold (invalid
// UTF-8, NUL) are refused before they reach the database, so the
// transaction goes on: writes with them are invalid, reads by them find
// nothing.
func TestPostgresUnstorableKeys(t *testing.T) {
	s, _ := postgresDB.open(t)
	for _, key := range []string{"nul\x00key", "bad\xffutf8"} {
		err := s.Update(t.Context(), func(tx store.Tx) error {
			if err := tx.PutNode(store.Node{ID: key}); !errors.Is(err, failure.ErrInvalid) {
				t.Errorf("PutNode(%q) = %v, want ErrInvalid", key, err)
			}
			if _, err := tx.SeeEvent("node-a", key, time.Now()); !errors.Is(err, failure.ErrInvalid) {
				t.Errorf("SeeEvent(%q) = %v, want ErrInvalid", key, err)
			}
			if _, err := tx.GetNode(key); !errors.Is(err, failure.ErrNotFound) {
				t.Errorf("GetNode(%q) = %v, want ErrNotFound", key, err)
			}
			if ops, err := tx.PendingOperations(key); err != nil || len(ops) != 0 {
				t.Errorf("PendingOperations(%q) = %v, %v", key, ops, err)
			}
			if runs, err := tx.ListRuns(store.ListRunsOptions{NodeID: key}); err != nil || len(runs) != 0 {
				t.Errorf("ListRuns(NodeID %q) = %v, %v", key, runs, err)
			}
			if _, err := tx.ListRuns(store.ListRunsOptions{Before: key}); !errors.Is(err, failure.ErrNotFound) {
				t.Errorf("ListRuns(Before %q) = %v, want ErrNotFound", key, err)
			}
			if err := tx.DeleteSessions(key); err != nil {
				t.Errorf("DeleteSessions(%q) = %v", key, err)
			}
			// The transaction is still usable.
			return tx.PutNode(store.Node{ID: "node-a"})
		})
		if err != nil {
			t.Fatalf("Update after unstorable keys: %v", err)
		}
	}
	err := s.Update(t.Context(), func(tx store.Tx) error {
		if err := tx.CreateRun(store.Run{}); err == nil {
			return errors.New("CreateRun without ID succeeded")
		}
		r := store.Run{}
		r.ID, r.Status = "run-1", "queued"
		if err := tx.CreateRun(r); err != nil {
			return err
		}
		runs, err := tx.ListRuns(store.ListRunsOptions{Statuses: []string{"queued", "bad\xff"}})
		if err != nil || len(runs) != 1 {
			return fmt.Errorf("ListRuns with one unstorable status = %d runs, %v; want run-1", len(runs), err)
		}
		if runs, err := tx.ListRuns(store.ListRunsOptions{Statuses: []string{"bad\xff"}}); err != nil || len(runs) != 0 {
			return fmt.Errorf("ListRuns with only an unstorable status = %d runs, %v; want none", len(runs), err)
		}
		_, err = tx.GetNode("node-a")
		return err
	})
	if err != nil {
		t.Error(err)
	}
}

// TestOpenPostgresHidesPassword: errors from opening a PostgreSQL URL never
// show its password, whether the URL does not parse or the server does not
// answer. Needs no server.
func TestOpenPostgresHidesPassword(t *testing.T) {
	const secret = "s3cr3t-pw"
	for _, dsn := range []string{
		"postgres://mercator:" + secret + "@127.0.0.1:notaport/db",
		"postgresql://mercator:" + secret + "@127.0.0.1:1/db?sslmode=disable&connect_timeout=5",
	} {
		_, err := Open(t.Context(), dsn)
		if err == nil {
			t.Errorf("Open(%q) succeeded", dsn)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open's error shows the password: %v", err)
		}
		if got := Redacted(dsn); strings.Contains(got, secret) || !strings.Contains(got, "mercator:xxxxx@") {
			t.Errorf("Redacted(%q) = %q", dsn, got)
		}
	}
	for _, dsn := range []string{"sqlite:///var/lib/mercator/m.db", "/tmp/m.db", "postgres://host/db"} {
		if got := Redacted(dsn); got != dsn {
			t.Errorf("Redacted(%q) = %q, want it unchanged", dsn, got)
		}
	}
}

// leaderAndReplica opens two Stores on one fresh schema, as two replicas,
// the first leading under the returned epoch.
func leaderAndReplica(t *testing.T) (a, b *Store, epoch int64) {
	t.Helper()
	a, dsn := postgresDB.open(t)
	b, err := Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if epoch, err = a.Lead(t.Context()); err != nil {
		t.Fatal(err)
	}
	return a, b, epoch
}

// TestPostgresLeadWaitsForThePlacementInFlight is the fence's other half:
// a replica (a) in the middle of a transaction that checked its epoch (an
// Update, which checks at once) is not overtaken by another (b) starting to
// lead. b's Lead waits, seen by the database as waiting on a lock, until a's
// transaction commits; a's next transaction is refused; what a committed is
// there for b to read. (An UpdateLocked checks with its last writes:
// TestPostgresLeadRefusesTheHeldPlacementInFlight.)
func TestPostgresLeadWaitsForThePlacementInFlight(t *testing.T) {
	a, b, epoch := leaderAndReplica(t)
	ctx := t.Context()
	checked, commit := make(chan struct{}), make(chan struct{})
	placed := make(chan error, 1)
	go func() {
		placed <- a.Update(ctx, func(tx store.Tx) error {
			if err := tx.CheckEpoch(epoch); err != nil {
				return err
			}
			if err := tx.PutNode(store.Node{ID: "placed-by-a"}); err != nil {
				return err
			}
			close(checked)
			<-commit
			return nil
		})
	}()
	<-checked
	led := make(chan int64, 1)
	go func() {
		e, err := b.Lead(ctx)
		if err != nil {
			t.Error(err)
		}
		led <- e
	}()
	// b's UPDATE of the epoch is blocked on a's shared lock: the database
	// says so, without a sleep standing in for it.
	deadline := time.Now().Add(time.Minute)
	for {
		var waiting int
		err := b.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE scheduling_epoch%'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case e := <-led:
			t.Fatalf("b led (epoch %d) while a's placement that checked epoch %d was still open", e, epoch)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("b's Lead never waited on a's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(commit)
	if err := <-placed; err != nil {
		t.Fatalf("a's placement, checked before b led: %v", err)
	}
	next := <-led
	if next <= epoch {
		t.Fatalf("b's epoch %d is not after a's %d", next, epoch)
	}
	err := a.UpdateLocked(ctx, func(tx store.Tx) error { return tx.CheckEpoch(epoch) })
	if !errors.Is(err, failure.ErrFenced) {
		t.Fatalf("a's next placement under epoch %d = %v, want ErrFenced", epoch, err)
	}
	if err := b.View(ctx, func(tx store.Tx) error { _, err := tx.GetNode("placed-by-a"); return err }); err != nil {
		t.Fatalf("b does not see what a committed before b led: %v", err)
	}
}

// TestPostgresLeadRefusesTheHeldPlacementInFlight: an UpdateLocked holds its
// epoch check back to send it with its last writes (held.go), so a replica
// (a) whose placement is in flight when another (b) starts to lead does not
// hold b back: b leads at once, and a's placement, rows locked and writes
// held, is refused as it commits and leaves nothing behind.
func TestPostgresLeadRefusesTheHeldPlacementInFlight(t *testing.T) {
	a, b, epoch := leaderAndReplica(t)
	ctx := t.Context()
	if err := a.Update(ctx, func(tx store.Tx) error { return tx.PutNode(store.Node{ID: "node-of-a"}) }); err != nil {
		t.Fatal(err)
	}
	checked, commit := make(chan struct{}), make(chan struct{})
	placed := make(chan error, 1)
	go func() {
		placed <- a.UpdateLocked(ctx, func(tx store.Tx) error {
			if err := tx.CheckEpoch(epoch); err != nil {
				return err
			}
			if _, err := tx.GetNodes([]string{"node-of-a"}); err != nil { // locked
				return err
			}
			if err := tx.PutOperations([]store.Operation{{ID: "op-of-a", NodeID: "node-of-a", CreatedAt: time.Now()}}); err != nil {
				return err
			}
			close(checked)
			<-commit
			return nil
		})
	}()
	<-checked
	next, err := b.Lead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next <= epoch {
		t.Fatalf("b's epoch %d is not after a's %d", next, epoch)
	}
	close(commit)
	if err := <-placed; !errors.Is(err, failure.ErrFenced) {
		t.Fatalf("a's placement under epoch %d, committing after b led = %v, want ErrFenced", epoch, err)
	}
	if err := b.View(ctx, func(tx store.Tx) error { _, err := tx.GetOperation("op-of-a"); return err }); !errors.Is(err, failure.ErrNotFound) {
		t.Fatalf("a's refused placement left its operation behind (%v)", err)
	}
}
