package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// A node's last-seen moment lives in a column of its own (last_seen_ns,
// Unix nanoseconds), beside the record's document: liveness is written for
// every heard node every flush period (Tx.NodesSeen), and writing it into
// the document meant decoding and re-encoding the whole record, facts and
// all, for each. The column is authoritative: a node read has the column's
// moment as its LastSeenAt, and PutNode writes the record's LastSeenAt to
// it (the document keeps a copy, which may trail).

// liveMigration adds the column and fills it from the documents.
var liveMigration = []string{
	`ALTER TABLE nodes ADD COLUMN last_seen_ns BIGINT`,
}

func liveBackfill(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, `SELECT id, doc FROM nodes`)
	if err != nil {
		return fmt.Errorf("backfill node last seen: %w", err)
	}
	seen := map[string]int64{}
	for rows.Next() {
		var id string
		var doc []byte
		if err := rows.Scan(&id, &doc); err != nil {
			rows.Close()
			return fmt.Errorf("backfill node last seen: %w", err)
		}
		n, err := decode[store.Node]("node", id, doc)
		if err != nil {
			rows.Close()
			return err
		}
		if n.LastSeenAt != nil {
			seen[id] = n.LastSeenAt.UnixNano()
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("backfill node last seen: %w", err)
	}
	for id, ns := range seen {
		if _, err := tx.ExecContext(ctx, `UPDATE nodes SET last_seen_ns = $1 WHERE id = $2`, ns, id); err != nil {
			return fmt.Errorf("backfill node last seen: %w", err)
		}
	}
	return nil
}

// withSeen gives n the column's moment (nil when NULL).
func withSeen(n store.Node, ns sql.NullInt64) store.Node {
	n.LastSeenAt = nil
	if ns.Valid {
		at := time.Unix(0, ns.Int64).UTC()
		n.LastSeenAt = &at
	}
	return n
}

func (t *txn) GetNode(id string) (store.Node, error) {
	var doc []byte
	var ns sql.NullInt64
	if err := t.getRow("node", id, `SELECT doc, last_seen_ns FROM nodes WHERE id = $1`, []any{id}, &doc, &ns); err != nil {
		return store.Node{}, err
	}
	n, err := decode[store.Node]("node", id, doc)
	return withSeen(n, ns), err
}

func (t *txn) ListNodes() ([]store.Node, error) {
	out := []store.Node{}
	var id string
	var doc []byte
	var ns sql.NullInt64
	err := t.listRows("node", `SELECT id, doc, last_seen_ns FROM nodes ORDER BY id`, nil, func() error {
		n, err := decode[store.Node]("node", id, doc)
		out = append(out, withSeen(n, ns))
		return err
	}, &id, &doc, &ns)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// A node's version (store.NodeVersion.Rev) is a column too (rev, schema
// 12): PutNode adds one to it, NodesSeen leaves it. With it, a replica's
// copy of the nodes' records reads every node's version and moment, a
// narrow row each, and the records of those that changed, where it read
// every record whole every liveness flush period (at 5,000 nodes on
// PostgreSQL, 157 ms of the database's time a read, and as much again of
// the replica's decoding).
var revMigration = []string{
	`ALTER TABLE nodes ADD COLUMN rev BIGINT NOT NULL DEFAULT 0`,
}

// NodeVersions implements store.Tx.
func (t *txn) NodeVersions() ([]store.NodeVersion, error) {
	out := []store.NodeVersion{}
	var v store.NodeVersion
	var ns sql.NullInt64
	err := t.listRows("node", `SELECT id, rev, last_seen_ns FROM nodes ORDER BY id`, nil, func() error {
		v.LastSeenAt = withSeen(store.Node{}, ns).LastSeenAt
		out = append(out, v)
		return nil
	}, &v.ID, &v.Rev, &ns)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (t *txn) PutNode(n store.Node) error {
	if err := record.Node(n); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("node", n.ID, n)
	if err != nil {
		return err
	}
	var ns sql.NullInt64
	if n.LastSeenAt != nil {
		ns = sql.NullInt64{Int64: n.LastSeenAt.UnixNano(), Valid: true}
	}
	_, err = t.exec("put", "node", n.ID,
		`INSERT INTO nodes (id, doc, last_seen_ns, rev) VALUES ($1, $2, $3, 1)
		ON CONFLICT (id) DO UPDATE SET doc = excluded.doc, last_seen_ns = excluded.last_seen_ns, rev = nodes.rev + 1`,
		n.ID, doc, ns)
	return err
}

// NodesSeen implements store.Tx: only the column is read and written. On
// PostgreSQL it is one statement for the whole batch, its rows locked in
// ID order (as placements lock them, so the two wait rather than
// deadlock); on SQLite, with its one writer, a statement a node.
func (t *txn) NodesSeen(seen map[string]time.Time) (map[string]time.Time, error) {
	if err := t.writable(); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		if _, bad := t.unstorable([]any{id}); !bad {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	before := make(map[string]time.Time, len(ids))
	note := func(id string, ns sql.NullInt64) {
		before[id] = time.Time{}
		if ns.Valid {
			before[id] = time.Unix(0, ns.Int64).UTC()
		}
	}
	if t.d.lockingTx != nil { // PostgreSQL
		nss := make([]int64, len(ids))
		for i, id := range ids {
			nss[i] = seen[id].UnixNano()
		}
		var id string
		var ns sql.NullInt64
		err := t.listRows("node", `UPDATE nodes AS n SET last_seen_ns = GREATEST(COALESCE(o.before, 0), i.ns)
			FROM unnest($1::text[], $2::bigint[]) AS i(id, ns)
			JOIN (SELECT id, last_seen_ns AS before FROM nodes WHERE id = ANY($1) ORDER BY id FOR UPDATE) AS o ON o.id = i.id
			WHERE n.id = i.id
			RETURNING n.id, o.before`, []any{ids, nss}, func() error { note(id, ns); return nil }, &id, &ns)
		return before, err
	}
	for _, id := range ids {
		var ns sql.NullInt64
		err := t.getRow("node", id, `SELECT last_seen_ns FROM nodes WHERE id = $1`, []any{id}, &ns)
		if err != nil {
			if errors.Is(err, failure.ErrNotFound) {
				continue
			}
			return nil, err
		}
		note(id, ns)
		at := seen[id].UnixNano()
		if ns.Valid && ns.Int64 >= at {
			continue
		}
		if _, err := t.exec("seen", "node", id, `UPDATE nodes SET last_seen_ns = $1 WHERE id = $2`, at, id); err != nil {
			return nil, err
		}
	}
	return before, nil
}
