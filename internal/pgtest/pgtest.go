// Package pgtest gives tests a PostgreSQL database of their own: the server
// named by MERCATOR_TEST_POSTGRES (scripts/test.sh sets it from
// scripts/ensure-postgres.sh), and a fresh schema on it per test, dropped
// when the test ends. Without the variable a test fails in CI (CI is set)
// and is skipped elsewhere, saying how to run it.
//
// Only tests import it: the store's, the content store's, the replicas', the composition
// root's and the end-to-end tests.
package pgtest

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/mercator/mercator/internal/pgschema"
)

// Env names the variable that gives the tests a PostgreSQL server.
const Env = "MERCATOR_TEST_POSTGRES"

// DSN returns the DSN of MERCATOR_TEST_POSTGRES; without it the test fails
// in CI and is skipped elsewhere.
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(Env)
	if dsn != "" {
		return dsn
	}
	const how = Env + ` is not set: run "export ` + Env + `=$(bash scripts/ensure-postgres.sh)" (as root) to test against PostgreSQL`
	if InCI() {
		t.Fatal(how + "; in CI the PostgreSQL tests must run")
	}
	t.Skip(how)
	return ""
}

// InCI reports whether the tests run in CI (CI set, and not "false" or
// "0"), where a missing PostgreSQL is a failure rather than a reason to
// skip.
func InCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v != "" && v != "false" && v != "0"
}

var admin struct {
	once sync.Once
	db   *sql.DB
	err  error
}

// adminDB is one pool on the server's database for creating and dropping
// the tests' schemas, shared by the whole test binary.
func adminDB(t testing.TB, dsn string) *sql.DB {
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
		t.Fatalf("%s: %v", Env, admin.err)
	}
	return admin.db
}

// FreshSchema makes a schema with a random name on the server, drops it
// (and everything in it) when t ends, and returns a DSN whose search_path
// selects it.
func FreshSchema(t testing.TB) string {
	t.Helper()
	base := DSN(t)
	db := adminDB(t, base)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema, dsn, err := pgschema.Create(ctx, db, base, "mercator_test_")
	if err != nil {
		t.Fatalf("%s: %v", Env, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pgschema.Drop(ctx, db, schema); err != nil {
			t.Error(err)
		}
	})
	return dsn
}
