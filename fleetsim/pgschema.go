package fleetsim

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// freshSchema makes a schema of its own for one simulation in the
// PostgreSQL database dsn names, and returns a DSN whose search_path
// selects it and a func that drops it with everything in it. A simulation
// run on the database itself found the nodes and the queue of the one
// before it (a backlog of old runs, thousands of nodes whose leases had
// lapsed), and reported them as its own.
func freshSchema(ctx context.Context, dsn string) (string, func(), error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", nil, fmt.Errorf("--db: %w", err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return "", nil, fmt.Errorf("--db: %w", err)
	}
	b := make([]byte, 6)
	rand.Read(b)
	schema := "fleetsim_" + hex.EncodeToString(b)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(cctx, "CREATE SCHEMA "+schema); err != nil {
		db.Close()
		return "", nil, fmt.Errorf("--db: create the simulation's schema %s: %w", schema, err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		db.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE")
		db.Close()
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), drop, nil
}
