// Package pgschema makes throw-away PostgreSQL schemas: one with a random
// name, a DSN whose search_path selects it, and its drop with everything in
// it. Tests (package pgtest) take one each, and so does each fleet
// simulation on PostgreSQL (package fleetsim), so that neither finds
// another's tables: a simulation run on the database itself once reported
// the nodes and backlog of the one before it as its own.
package pgschema

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
)

// Create makes a schema named prefix followed by random hex through db
// (a pool on the database dsn names) and returns its name and a DSN
// that selects it.
func Create(ctx context.Context, db *sql.DB, dsn, prefix string) (schema, scoped string, err error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", "", fmt.Errorf("parse the PostgreSQL URL: %w", err)
	}
	b := make([]byte, 8)
	rand.Read(b)
	schema = prefix + hex.EncodeToString(b)
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", "", fmt.Errorf("create schema %s: %w", schema, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return schema, u.String(), nil
}

// Drop drops schema and everything in it.
func Drop(ctx context.Context, db *sql.DB, schema string) error {
	if _, err := db.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, err)
	}
	return nil
}
