package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// postgresEnv names the variable that gives the tests a PostgreSQL database
// to work in: a DSN whose role may create schemas in it, as
// scripts/ensure-postgres.sh prints. Each test makes a schema of its own
// there and drops it afterwards, so parallel runs do not collide.
const postgresEnv = "MERCATOR_TEST_POSTGRES"

// testDB is a database kind the tests run against.
type testDB struct {
	name string
	// fresh returns the DSN of a new, empty database that lives until t
	// ends.
	fresh func(t *testing.T) string
	// reopenDSN is another spelling of dsn for the same database, so that
	// reopening also exercises it (SQLite: the bare path).
	reopenDSN func(dsn string) string
}

var sqliteDB = testDB{
	name: "sqlite",
	fresh: func(t *testing.T) string {
		return "sqlite://" + filepath.Join(t.TempDir(), "state", "mercator.db")
	},
	reopenDSN: func(dsn string) string { return strings.TrimPrefix(dsn, "sqlite://") },
}

var postgresDB = testDB{
	name:      "postgres",
	fresh:     freshPostgres,
	reopenDSN: func(dsn string) string { return dsn },
}

// open opens a fresh database of this kind, closed when t ends, and returns
// it with its DSN.
func (tdb testDB) open(t *testing.T) (*Store, string) {
	t.Helper()
	dsn := tdb.fresh(t)
	s, err := Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dsn
}

// forEachDB runs fn as a subtest per database kind.
func forEachDB(t *testing.T, fn func(t *testing.T, tdb testDB)) {
	for _, tdb := range []testDB{sqliteDB, postgresDB} {
		t.Run(tdb.name, func(t *testing.T) { fn(t, tdb) })
	}
}

// tableCount is how many tables named name the store's schema has.
func tableCount(t *testing.T, s *Store, name string) (int, error) {
	t.Helper()
	q := `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = $1`
	if s.d == postgresDialect {
		q = `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = $1`
	}
	var n int
	err := s.db.QueryRowContext(t.Context(), q, name).Scan(&n)
	return n, err
}

// inCI reports whether the tests run in CI, where a missing PostgreSQL is a
// failure rather than a reason to skip.
func inCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v != "" && v != "false" && v != "0"
}

// postgresDSN returns the DSN of MERCATOR_TEST_POSTGRES. Without it the
// test fails in CI and is skipped elsewhere.
func postgresDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv(postgresEnv)
	if dsn != "" {
		return dsn
	}
	const how = postgresEnv + ` is not set: run "export ` + postgresEnv + `=$(bash scripts/ensure-postgres.sh)" (as root) to test against PostgreSQL`
	if inCI() {
		t.Fatal(how + "; in CI the PostgreSQL tests must run")
	}
	t.Skip(how)
	return ""
}

var admin struct {
	once sync.Once
	db   *sql.DB
	err  error
}

// adminDB is one pool on MERCATOR_TEST_POSTGRES's database for creating and
// dropping the tests' schemas, shared by the whole test binary.
func adminDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	admin.once.Do(func() {
		admin.db, admin.err = sql.Open("pgx", dsn)
		if admin.err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			admin.err = admin.db.PingContext(ctx)
		}
	})
	if admin.err != nil {
		t.Fatalf("%s: %s: %v", postgresEnv, Redacted(dsn), admin.err)
	}
	return admin.db
}

// freshPostgres makes a schema with a random name in MERCATOR_TEST_POSTGRES's
// database, drops it (and everything in it) when t ends, and returns a DSN
// whose search_path selects it.
func freshPostgres(t *testing.T) string {
	t.Helper()
	base := postgresDSN(t)
	db := adminDB(t, base)
	b := make([]byte, 8)
	rand.Read(b)
	schema := "mercator_test_" + hex.EncodeToString(b)
	if _, err := db.ExecContext(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("%s: %v", postgresEnv, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
