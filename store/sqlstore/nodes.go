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
// all, for each. PutNode writes the record's LastSeenAt to the column (the
// document keeps a copy, which may trail). Since schema 13 NodesSeen
// writes its moments to a table of their own instead (node_seen, see
// seenMigration), and a node read has the later of the two as its
// LastSeenAt (withSeen).

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

// withSeen gives n its last-seen moment: the later of the nodes column's
// (what PutNode wrote) and node_seen's (what NodesSeen wrote), nil when
// neither holds one.
func withSeen(n store.Node, put, heard sql.NullInt64) store.Node {
	n.LastSeenAt = nil
	if heard.Valid && (!put.Valid || heard.Int64 > put.Int64) {
		put = heard
	}
	if put.Valid {
		at := time.Unix(0, put.Int64).UTC()
		n.LastSeenAt = &at
	}
	return n
}

// nodeColumns is what every read of node records selects, from nodes AS n
// joined with its node_seen row (nodeJoin), for withSeen. A read of one
// node (GetNode) reads the row by a subquery instead (getRow's lock, a
// plain FOR UPDATE, cannot take a joined table's nullable side).
const (
	nodeColumns = `n.id, n.doc, n.last_seen_ns, s.ns`
	nodeJoin    = `nodes AS n LEFT JOIN node_seen AS s ON s.id = n.id`
	nodeHeard   = `(SELECT ns FROM node_seen WHERE id = n.id)`
)

func (t *txn) GetNode(id string) (store.Node, error) { return t.getNode(id, "") }

// getNode is GetNode, the query ending with suffix.
func (t *txn) getNode(id, suffix string) (store.Node, error) {
	var doc []byte
	var put, heard sql.NullInt64
	if err := t.getRow("node", id, `SELECT n.doc, n.last_seen_ns, `+nodeHeard+` FROM nodes AS n WHERE n.id = $1`+suffix, []any{id}, &doc, &put, &heard); err != nil {
		return store.Node{}, err
	}
	n, err := decode[store.Node]("node", id, doc)
	return withSeen(n, put, heard), err
}

// eachNode reads the records nodeColumns selects, filtered and ordered by
// tail (which names the nodes table n), giving each to fn.
func (t *txn) eachNode(tail string, args []any, fn func(store.Node)) error {
	var id string
	var doc []byte
	var put, heard sql.NullInt64
	return t.listRows("node", `SELECT `+nodeColumns+` FROM `+nodeJoin+` `+tail, args, func() error {
		n, err := decode[store.Node]("node", id, doc)
		fn(withSeen(n, put, heard))
		return err
	}, &id, &doc, &put, &heard)
}

// LockNode implements store.Tx. On PostgreSQL the read takes the row's
// lock (FOR UPDATE) in an Update too, where a row written since the
// snapshot fails it with a serialization error, which Update retries;
// SQLite's one writer holds everything already.
func (t *txn) LockNode(id string) (store.Node, error) {
	if err := t.writable(); err != nil {
		return store.Node{}, err
	}
	lock := ""
	if t.d.lockingTx != nil && !t.lockRows { // PostgreSQL, where getRow does not lock already
		lock = " FOR UPDATE"
	}
	return t.getNode(id, lock)
}

func (t *txn) ListNodes() ([]store.Node, error) {
	out := []store.Node{}
	err := t.eachNode(`ORDER BY n.id`, nil, func(n store.Node) { out = append(out, n) })
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

// seenMigration (schema 13) moves the moments liveness writes out of the
// nodes table into node_seen, a narrow row a node: the last moment
// NodesSeen recorded (Unix nanoseconds). A node's LastSeenAt is the later
// of that and the nodes column's (what PutNode wrote, and every moment
// before this schema), so nothing is copied. At 10,000 nodes on
// PostgreSQL the flush that wrote the nodes rows was the database's
// costliest statement (253 of 827 s in a 100,000-run hold), most of it
// waiting on the row locks placements hold on their nodes. One row a
// node, as nodes are never deleted: the table grows with the fleet and no
// further.
var seenMigration = []string{
	`CREATE TABLE node_seen (id TEXT PRIMARY KEY, ns BIGINT NOT NULL)`,
}

// NodeVersions implements store.Tx.
func (t *txn) NodeVersions() ([]store.NodeVersion, error) {
	out := []store.NodeVersion{}
	var v store.NodeVersion
	var put, heard sql.NullInt64
	err := t.listRows("node", `SELECT n.id, n.rev, n.last_seen_ns, s.ns FROM `+nodeJoin+` ORDER BY n.id`, nil, func() error {
		v.LastSeenAt = withSeen(store.Node{}, put, heard).LastSeenAt
		out = append(out, v)
		return nil
	}, &v.ID, &v.Rev, &put, &heard)
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

// NodesSeen implements store.Tx: it writes node_seen alone, never the
// nodes table, so a liveness flush neither rewrites a node's row (on
// PostgreSQL an update writes a new version of the whole row, document and
// all) nor waits for the row locks a placement takes on its nodes
// (plancommit.Apply's GetNodes), nor makes placements wait for it. On
// PostgreSQL the whole batch is one statement, the node_seen rows locked in
// ID order so that two replicas' flushes wait rather than deadlock; a node
// without a row yet (its first flush) takes a second. On SQLite, with its
// one writer, it is a read and a write a node.
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
	if t.d.lockingTx != nil { // PostgreSQL
		return before, t.nodesSeenBatch(ids, seen, before)
	}
	for _, id := range ids {
		var put, heard sql.NullInt64
		err := t.getRow("node", id, `SELECT n.last_seen_ns, s.ns FROM `+nodeJoin+` WHERE n.id = $1`, []any{id}, &put, &heard)
		if err != nil {
			if errors.Is(err, failure.ErrNotFound) {
				continue
			}
			return nil, err
		}
		noteBefore(before, id, put, heard)
		at := seen[id].UnixNano()
		if heard.Valid && heard.Int64 >= at {
			continue
		}
		if _, err := t.exec("seen", "node", id, `INSERT INTO node_seen (id, ns) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET ns = excluded.ns`, id, at); err != nil {
			return nil, err
		}
	}
	return before, nil
}

// noteBefore records in before the moment a node had before NodesSeen
// (zero for none), from its two columns.
func noteBefore(before map[string]time.Time, id string, put, heard sql.NullInt64) {
	before[id] = time.Time{}
	if at := withSeen(store.Node{}, put, heard).LastSeenAt; at != nil {
		before[id] = *at
	}
}

// nodesSeenBatch is NodesSeen on PostgreSQL, for ids (sorted): one update
// of the node_seen rows that exist, and, when some ids did not answer, one
// insert of the rows of those among them that are stored nodes. The
// insert's before is the nodes column's moment: a row another replica's
// flush inserted between the two statements is raised (GREATEST), and its
// moment missed only by before, which counts lapses.
func (t *txn) nodesSeenBatch(ids []string, seen, before map[string]time.Time) error {
	nss := make([]int64, len(ids))
	for i, id := range ids {
		nss[i] = seen[id].UnixNano()
	}
	var id string
	var put, heard sql.NullInt64
	each := func() error { noteBefore(before, id, put, heard); return nil }
	err := t.listRows("node", `UPDATE node_seen AS s SET ns = GREATEST(o.before, i.ns)
		FROM unnest($1::text[], $2::bigint[]) AS i(id, ns)
		JOIN (SELECT id, ns AS before FROM node_seen WHERE id = ANY($1) ORDER BY id FOR UPDATE) AS o ON o.id = i.id
		JOIN nodes AS n ON n.id = i.id
		WHERE s.id = i.id
		RETURNING s.id, n.last_seen_ns, o.before`, []any{ids, nss}, each, &id, &put, &heard)
	if err != nil {
		return err
	}
	var newIDs []string
	var newNss []int64
	for i, id := range ids {
		if _, answered := before[id]; !answered {
			newIDs, newNss = append(newIDs, id), append(newNss, nss[i])
		}
	}
	if len(newIDs) == 0 {
		return nil
	}
	heard = sql.NullInt64{}
	return t.listRows("node", `INSERT INTO node_seen AS s (id, ns)
		SELECT n.id, i.ns FROM unnest($1::text[], $2::bigint[]) AS i(id, ns) JOIN nodes AS n ON n.id = i.id ORDER BY n.id
		ON CONFLICT (id) DO UPDATE SET ns = GREATEST(s.ns, excluded.ns)
		RETURNING s.id, (SELECT last_seen_ns FROM nodes WHERE id = s.id)`, []any{newIDs, newNss}, each, &id, &put)
}
