package sqlstore

import (
	"context"
	"database/sql"
	"sync"
)

// stmtCache keeps one prepared statement per query text, so that a query
// is parsed and planned once per connection rather than at every use.
// SQLite (modernc's driver) prepares a statement from its text at every
// Exec and Query; at fleet scale the parser was a third of the single
// writer's time. PostgreSQL's driver (pgx) has a statement cache of its
// own, so only SQLite uses this one.
//
// A miss never blocks a transaction: the query runs unprepared and the
// statement is prepared in the background. Preparing on the pool from
// inside a transaction could deadlock, since it needs a second connection
// while holding one, and every connection may be held by a transaction
// doing the same. Once prepared, Tx.StmtContext reuses the statement on
// the transaction's own connection (preparing it there the first time).
type stmtCache struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
	// pending holds the queries being prepared, so that concurrent misses
	// prepare once.
	pending map[string]bool
	closed  bool
	// preparing counts the prepares in flight, which close waits for: one
	// still holding a connection when the database is closed keeps the
	// file open (and its -wal and -shm beside it) after Close returned.
	preparing sync.WaitGroup
}

// maxCachedStmts bounds the cache: queries are constant strings in this
// package, a few dozen, but a query built with a variable number of
// placeholders would otherwise add entries without end.
const maxCachedStmts = 256

func newStmtCache(db *sql.DB) *stmtCache {
	return &stmtCache{db: db, m: map[string]*sql.Stmt{}, pending: map[string]bool{}}
}

// get returns the prepared statement for query, or nil when there is none
// yet (one is then being prepared) or the cache is full. A nil cache has
// none.
func (c *stmtCache) get(query string) *sql.Stmt {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.m[query]; ok {
		return st
	}
	if c.closed || c.pending[query] || len(c.m)+len(c.pending) >= maxCachedStmts {
		return nil
	}
	c.pending[query] = true
	c.preparing.Add(1)
	go c.prepare(query)
	return nil
}

func (c *stmtCache) prepare(query string) {
	defer c.preparing.Done()
	st, err := c.db.PrepareContext(context.Background(), query)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, query)
	if err != nil {
		return // the query runs unprepared, where its error is reported
	}
	if c.closed {
		st.Close()
		return
	}
	c.m[query] = st
}

// close closes the cached statements, once the prepares in flight have
// ended; later gets return nil.
func (c *stmtCache) close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.preparing.Wait() // a prepare ending now closes its own statement
	c.mu.Lock()
	defer c.mu.Unlock()
	for q, st := range c.m {
		st.Close()
		delete(c.m, q)
	}
}

// execContext, queryContext and queryRowContext are the transaction's
// ExecContext, QueryContext and QueryRowContext through the cache.
func (t *txn) execContext(query string, args ...any) (sql.Result, error) {
	if err := t.sendHeld(false); err != nil {
		return nil, err
	}
	if st := t.stmts.get(query); st != nil {
		return t.tx.StmtContext(t.ctx, st).ExecContext(t.ctx, args...)
	}
	return t.tx.ExecContext(t.ctx, query, args...)
}

func (t *txn) queryContext(query string, args ...any) (*sql.Rows, error) {
	if err := t.sendHeld(false); err != nil {
		return nil, err
	}
	if st := t.stmts.get(query); st != nil {
		return t.tx.StmtContext(t.ctx, st).QueryContext(t.ctx, args...)
	}
	return t.tx.QueryContext(t.ctx, query, args...)
}

func (t *txn) queryRowContext(query string, args ...any) *sql.Row {
	// A failed send aborted the transaction: the query then fails, and the
	// commit returns the send's error (held.err).
	_ = t.sendHeld(false)
	if st := t.stmts.get(query); st != nil {
		return t.tx.StmtContext(t.ctx, st).QueryRowContext(t.ctx, args...)
	}
	return t.tx.QueryRowContext(t.ctx, query, args...)
}
