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
// What cannot be written once lives here: the driver, a column type, how
// transactions are isolated and retried, and how errors are recognised.
// sqliteDialect is below; postgresDialect is in postgres.go.
type dialect struct {
	name   string
	driver string // database/sql driver name
	// types replaces the {{…}} placeholders in migrations.
	types *strings.Replacer
	// writeTx and readTx are the options of Update's and View's
	// transactions. For SQLite the write lock is taken at BEGIN by the
	// connection's _txlock=immediate, so writeTx is nil; PostgreSQL uses
	// LevelSerializable for Update and a read-only LevelRepeatableRead for
	// View (see postgresDialect for why).
	writeTx, readTx *sql.TxOptions
	// lockingTx, when set, is the options of UpdateLocked's transactions,
	// whose reads by key lock their rows (see store.UpdateLocked); nil
	// makes UpdateLocked an Update (SQLite, which has one writer anyway
	// and no FOR UPDATE).
	lockingTx *sql.TxOptions
	// migrateTx is the options of the migration transaction, and
	// lockMigrations, when not empty, the statement it runs first to
	// exclude other processes migrating the same schema. SQLite's
	// BEGIN IMMEDIATE already does; PostgreSQL takes an advisory lock
	// under READ COMMITTED, so that the statements after the lock see
	// what a migrator that held it before committed.
	migrateTx      *sql.TxOptions
	lockMigrations string
	// serializeWriters makes Update hold an in-process lock around each
	// write transaction. SQLite has one writer at a time anyway; queueing
	// writers on a Go channel spares them SQLite's busy-wait sleeps, which
	// are coarse. busy_timeout still covers another process on the file.
	serializeWriters bool
	// maxAttempts bounds how often Update runs a transaction that failed
	// for a retryable reason.
	maxAttempts int
	// retryable reports whether an Update that failed with err may succeed
	// if run again (a lock held elsewhere, a serialization failure).
	retryable func(err error) bool
	// uniqueViolation reports whether err is a unique or primary key
	// constraint failure.
	uniqueViolation func(err error) bool
	// holdWrites makes UpdateLocked's transactions hold back the writes
	// whose outcome they know, to send them as one statement (held.go).
	holdWrites bool
	// arrays is set when the database takes array parameters (unnest,
	// = ANY), which the batch forms of the placement path use (batch.go).
	arrays bool
	// textIsUTF8 is set when TEXT columns hold only valid UTF-8 without
	// NUL (PostgreSQL). Keys that cannot be stored are then caught before
	// they reach the database (see txn.unstorable), rather than failing
	// with an error that would also abort a PostgreSQL transaction.
	textIsUTF8 bool
}

var sqliteDialect = &dialect{
	name:   "sqlite",
	driver: "sqlite",
	types: strings.NewReplacer(
		"{{BLOB}}", "BLOB",
	),
	writeTx:          nil,
	readTx:           &sql.TxOptions{ReadOnly: true},
	migrateTx:        nil,
	serializeWriters: true,
	maxAttempts:      8,
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
