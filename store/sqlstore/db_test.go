package sqlstore

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/mercator/mercator/internal/pgtest"
)

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
	fresh:     func(t *testing.T) string { return pgtest.FreshSchema(t) }, // a schema of its own, dropped afterwards
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
