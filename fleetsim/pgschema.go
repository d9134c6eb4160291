package fleetsim

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/mercator/mercator/internal/pgschema"
)

// freshSchema makes a schema of its own for one simulation in the
// PostgreSQL database dsn names (package pgschema), and returns a DSN that
// selects it and a func that drops it with everything in it.
func freshSchema(ctx context.Context, dsn string) (string, func(), error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return "", nil, fmt.Errorf("--db: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	schema, scoped, err := pgschema.Create(cctx, db, dsn, "fleetsim_")
	if err != nil {
		db.Close()
		return "", nil, fmt.Errorf("--db: %w", err)
	}
	return scoped, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		pgschema.Drop(ctx, db, schema)
		db.Close()
	}, nil
}
