package sqlstore

import (
	"database/sql"
	"errors"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// dialect is everything that differs between the databases sqlstore speaks.
// Queries are written once, in the SQL both SQLite and PostgreSQL accept:
// $1-style placeholders, INSERT … ON CONFLICT for upserts and for
// "create unless it exists", row-value comparisons, BIGINT and TEXT columns.
// What cannot be written once lives here, so adding PostgreSQL is a new
// dialect value (driver "pgx", types BYTEA, serializable transactions
// retried on SQLSTATE 40001) and no new queries.
type dialect struct {
	name   string
	driver string // database/sql driver name
	// types replaces the {{…}} placeholders in migrations.
	types *strings.Replacer
	// writeTx and readTx are the options of Update's and View's
	// transactions. For SQLite the write lock is taken at BEGIN by the
	// connection's _txlock=immediate, so writeTx is nil; PostgreSQL would
	// use LevelSerializable here and ReadOnly with LevelRepeatableRead for
	// View.
	writeTx, readTx *sql.TxOptions
	// serializeWriters makes Update hold an in-process lock around each
	// write transaction. SQLite has one writer at a time anyway; queueing
	// writers on a Go channel spares them SQLite's busy-wait sleeps, which
	// are coarse. busy_timeout still covers another process on the file.
	serializeWriters bool
	// retryable reports whether an Update that failed with err may succeed
	// if run again (a lock held elsewhere, a serialization failure).
	retryable func(err error) bool
	// uniqueViolation reports whether err is a unique or primary key
	// constraint failure.
	uniqueViolation func(err error) bool
}

var sqliteDialect = &dialect{
	name:   "sqlite",
	driver: "sqlite",
	types: strings.NewReplacer(
		"{{BLOB}}", "BLOB",
	),
	writeTx:          nil,
	readTx:           &sql.TxOptions{ReadOnly: true},
	serializeWriters: true,
	retryable: func(err error) bool {
		code, ok := sqliteCode(err)
		if !ok {
			return false
		}
		primary := code & 0xff
		return primary == sqlite3.SQLITE_BUSY || primary == sqlite3.SQLITE_LOCKED
	},
	uniqueViolation: func(err error) bool {
		code, ok := sqliteCode(err)
		return ok && (code == sqlite3.SQLITE_CONSTRAINT_UNIQUE || code == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
	},
}

func sqliteCode(err error) (int, bool) {
	var e *sqlite.Error
	if errors.As(err, &e) {
		return e.Code(), true
	}
	return 0, false
}
