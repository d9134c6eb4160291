package sqlstore

import (
	"slices"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// The batch forms of the placement path. On PostgreSQL each is a handful of
// statements over arrays (unnest) whatever the batch's size: the leader
// committed placements at 220–300 a second when each run cost five round
// trips. SQLite, in process and with one writer, runs the single-record
// forms in a loop, which costs it nothing more.

// batched reports whether this transaction's database takes array
// parameters (PostgreSQL).
func (t *txn) batched() bool { return t.d.arrays }

// storable drops keys the database cannot hold (they match no record).
func (t *txn) storable(ids []string) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if _, bad := t.unstorable([]any{id}); !bad {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// runRows is a batch of runs as the runs table's columns, each run checked
// and encoded: what CreateRuns inserts and PutRuns updates.
type runRows struct {
	ids, docs, statuses, projects []string
	secs, nsecs                   []int64
	finished                      []*int64
}

func (t *txn) runRows(runs []store.Run) (runRows, error) {
	n := len(runs)
	c := runRows{ids: make([]string, n), docs: make([]string, n), statuses: make([]string, n), projects: make([]string, n),
		secs: make([]int64, n), nsecs: make([]int64, n), finished: make([]*int64, n)}
	for i, r := range runs {
		if err := record.Run(r); err != nil {
			return c, err
		}
		if key, bad := t.unstorable([]any{r.ID}); bad {
			return c, t.invalidKey("run", key)
		}
		doc, err := encode("run", r.ID, r)
		if err != nil {
			return c, err
		}
		c.ids[i], c.docs[i], c.statuses[i], c.projects[i] = r.ID, doc, r.Status, record.RunProject(r)
		c.secs[i], c.nsecs[i] = r.CreatedAt.Unix(), int64(r.CreatedAt.Nanosecond())
		if v, ok := record.RunFinished(r); ok {
			c.finished[i] = &v
		}
	}
	return c, nil
}

// lockSuffix is what makes a read lock table's rows in UpdateLocked (table
// is the name or alias the read gives it; a joined table's rows are not
// locked).
func (t *txn) lockSuffix(table string) string {
	if t.lockRows {
		return " FOR UPDATE OF " + table
	}
	return ""
}

func (t *txn) GetNodes(ids []string) ([]store.Node, error) {
	ids = t.storable(ids)
	if !t.batched() {
		return store.GetEach(ids, t.GetNode)
	}
	out := make([]store.Node, 0, len(ids))
	err := t.eachNode(`WHERE n.id = ANY($1) ORDER BY n.id`+t.lockSuffix("n"), []any{ids}, func(n store.Node) { out = append(out, n) })
	return out, err
}

func (t *txn) GetRuns(ids []string) ([]store.Run, error) {
	runs, err := getDocs(t, "run", "runs", ids, t.GetRun)
	if err == nil && t.write {
		for _, r := range runs {
			t.noteRunNodes(r.ID, record.NodeIDs(r))
		}
	}
	return runs, err
}

func (t *txn) GetOperations(ids []string) ([]store.Operation, error) {
	return getDocs(t, "operation", "operations", ids, t.GetOperation)
}

// getDocs is the records of table (an id and a doc column) among ids, in
// ID order, once each, missing ones skipped: one statement where the
// database takes arrays (locking the rows in UpdateLocked), else get for
// each.
func getDocs[T any](t *txn, what, table string, ids []string, get func(string) (T, error)) ([]T, error) {
	ids = t.storable(ids)
	if !t.batched() {
		return store.GetEach(ids, get)
	}
	out := make([]T, 0, len(ids))
	var id string
	var doc []byte
	err := t.listRows(what, `SELECT id, doc FROM `+table+` WHERE id = ANY($1) ORDER BY id`+t.lockSuffix(table), []any{ids}, func() error {
		v, err := decode[T](what, id, doc)
		out = append(out, v)
		return err
	}, &id, &doc)
	return out, err
}

func (t *txn) CreateRuns(runs []store.Run) error {
	if !t.batched() {
		return store.Each(runs, t.CreateRun)
	}
	if err := t.writable(); err != nil {
		return err
	}
	if len(runs) == 0 {
		return nil
	}
	c, err := t.runRows(runs)
	if err != nil {
		return err
	}
	var index [2][]string // (run, node) pairs
	for _, r := range runs {
		for _, nodeID := range record.NodeIDs(r) {
			index[0], index[1] = append(index[0], r.ID), append(index[1], nodeID)
		}
	}
	created := make(map[string]bool, len(runs))
	var id string
	err = t.listRows("run", `INSERT INTO runs (id, created_sec, created_nsec, status, doc, finished_sec, project)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::bigint[], $7::text[])
		ON CONFLICT (id) DO NOTHING RETURNING id`, []any{c.ids, c.secs, c.nsecs, c.statuses, c.docs, c.finished, c.projects},
		func() error { created[id] = true; return nil }, &id)
	if err != nil {
		return err
	}
	for _, id := range c.ids {
		if !created[id] {
			return failure.Conflict("run %q already exists", id)
		}
		delete(created, id) // a repeat later in the batch was not created
	}
	return t.indexRuns(runs, index)
}

func (t *txn) PutRuns(runs []store.Run) error {
	if !t.batched() {
		return store.Each(runs, t.PutRun)
	}
	if err := t.writable(); err != nil {
		return err
	}
	if len(runs) == 0 {
		return nil
	}
	c, err := t.runRows(runs)
	if err != nil {
		return err
	}
	var forget []string       // runs whose run_nodes this transaction has not read
	var drop, add [2][]string // (run, node) pairs to delete and insert
	for _, r := range runs {
		nodes := record.NodeIDs(r)
		old, known := t.runNodes[r.ID]
		if !known {
			forget = append(forget, r.ID)
		}
		for _, nodeID := range old {
			if _, keep := slices.BinarySearch(nodes, nodeID); !keep {
				drop[0], drop[1] = append(drop[0], r.ID), append(drop[1], nodeID)
			}
		}
		for _, nodeID := range nodes {
			if _, had := slices.BinarySearch(old, nodeID); !had {
				add[0], add[1] = append(add[0], r.ID), append(add[1], nodeID)
			}
		}
	}
	const update = `UPDATE runs AS r SET created_sec = v.cs, created_nsec = v.cns, status = v.status, doc = v.doc, finished_sec = v.fin
		FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::bigint[]) AS v(id, cs, cns, status, doc, fin)
		WHERE r.id = v.id RETURNING r.id`
	updateArgs := []any{c.ids, c.secs, c.nsecs, c.statuses, c.docs, c.finished}
	if t.holding() && len(forget) == 0 && !hasRepeats(c.ids) {
		// Every run was read (locked) or written here: the update
		// cannot miss, and the index rows dropped and added are apart.
		unit := []heldWrite{{table: "runs", query: update, args: updateArgs, returns: len(c.ids), what: "run", id: c.ids[0]}}
		if len(drop[0]) > 0 {
			unit = append(unit, heldWrite{table: "run_nodes", query: dropRunNodes, args: []any{drop[0], drop[1]}, returns: -1, what: "run", id: drop[0][0]})
		}
		if len(add[0]) > 0 {
			unit = append(unit, heldWrite{table: "run_nodes", query: addRunNodes, args: []any{add[0], add[1]}, returns: -1, what: "run", id: add[0][0]})
		}
		if err := t.hold(unit...); err != nil {
			return err
		}
		for _, r := range runs {
			t.noteRunNodes(r.ID, record.NodeIDs(r))
		}
		return nil
	}
	updated := map[string]bool{}
	var id string
	err = t.listRows("run", update, updateArgs, func() error { updated[id] = true; return nil }, &id)
	if err != nil {
		return err
	}
	for _, id := range c.ids {
		if !updated[id] {
			return failure.NotFound("run", id)
		}
	}
	if len(forget) > 0 {
		if _, err := t.exec("index", "run", forget[0], `DELETE FROM run_nodes WHERE run_id = ANY($1)`, forget); err != nil {
			return err
		}
	}
	if len(drop[0]) > 0 {
		if _, err := t.exec("index", "run", drop[0][0], dropRunNodes, drop[0], drop[1]); err != nil {
			return err
		}
	}
	return t.indexRuns(runs, add)
}

// The run_nodes statements of the batch forms: (run, node) pairs dropped
// and added.
const (
	dropRunNodes = `DELETE FROM run_nodes WHERE (run_id, node_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`
	addRunNodes  = `INSERT INTO run_nodes (run_id, node_id) SELECT * FROM unnest($1::text[], $2::text[])`
)

// hasRepeats reports whether a batch names one ID twice: its rows would be
// written twice by one statement, which PostgreSQL does only once.
func hasRepeats(ids []string) bool {
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			return true
		}
		seen[id] = true
	}
	return false
}

// indexRuns inserts the (run, node) pairs of add into run_nodes in one
// statement and notes each run's nodes as now indexed (txn.runNodes).
func (t *txn) indexRuns(runs []store.Run, add [2][]string) error {
	if len(add[0]) > 0 {
		if _, err := t.exec("index", "run", add[0][0], addRunNodes, add[0], add[1]); err != nil {
			return err
		}
	}
	for _, r := range runs {
		t.noteRunNodes(r.ID, record.NodeIDs(r))
	}
	return nil
}

func (t *txn) PutOperations(ops []store.Operation) error {
	if !t.batched() {
		return store.Each(ops, t.PutOperation)
	}
	if err := t.writable(); err != nil {
		return err
	}
	if len(ops) == 0 {
		return nil
	}
	n := len(ops)
	ids, nodes, docs := make([]string, n), make([]string, n), make([]string, n)
	pending, secs, nsecs := make([]int64, n), make([]int64, n), make([]int64, n)
	for i, op := range ops {
		if err := record.Operation(op); err != nil {
			return err
		}
		if key, bad := t.unstorable([]any{op.ID, op.NodeID}); bad {
			return t.invalidKey("operation", key)
		}
		doc, err := encode("operation", op.ID, op)
		if err != nil {
			return err
		}
		ids[i], nodes[i], docs[i] = op.ID, op.NodeID, doc
		if op.Result == nil {
			pending[i] = 1
		}
		secs[i], nsecs[i] = op.CreatedAt.Unix(), int64(op.CreatedAt.Nanosecond())
	}
	const upsert = `INSERT INTO operations (id, node_id, pending, created_sec, created_nsec, doc)
		SELECT * FROM unnest($1::text[], $2::text[], $3::integer[], $4::bigint[], $5::bigint[], $6::text[])
		ON CONFLICT (id) DO UPDATE SET node_id = excluded.node_id, pending = excluded.pending,
		  created_sec = excluded.created_sec, created_nsec = excluded.created_nsec, doc = excluded.doc`
	if t.holding() { // an upsert cannot miss
		return t.hold(heldWrite{table: "operations", query: upsert, args: []any{ids, nodes, pending, secs, nsecs, docs},
			returns: -1, what: "operation", id: ids[0]})
	}
	_, err := t.exec("put", "operation", ids[0], upsert, ids, nodes, pending, secs, nsecs, docs)
	return err
}

// SeeEvents records a node's events in one statement on PostgreSQL
// (SeeEventBatches).
func (t *txn) SeeEvents(nodeID string, eventIDs []string, at time.Time) ([]bool, error) {
	if !t.batched() {
		return store.SeeEach(nodeID, eventIDs, at, t.SeeEvent)
	}
	fresh, err := t.SeeEventBatches([]store.EventCheck{{NodeID: nodeID, EventIDs: eventIDs, At: at}})
	if err != nil {
		return nil, err
	}
	return fresh[0], nil
}

// SeeEventBatches records several nodes' events in one statement on
// PostgreSQL: the rows its INSERT returns are the fresh ones (neither
// already recorded nor at or below their node's watermark for their
// incarnation, as in SeeEvent). IDs without a sequence are carried as an
// empty incarnation and sequence -1, stored as NULL as SeeEvent stores
// them. A node and ID repeated among the batches is fresh at most at its
// first place.
func (t *txn) SeeEventBatches(batches []store.EventCheck) ([][]bool, error) {
	if !t.batched() {
		return store.SeeBatches(batches, t.SeeEvents)
	}
	if err := t.writable(); err != nil {
		return nil, err
	}
	type place struct{ batch, index int }
	fresh := make([][]bool, len(batches))
	first := map[[2]string]place{} // node and ID → its first place
	var nodes, ids, ats, incs []string
	var seqs []int64
	for k, b := range batches {
		fresh[k] = make([]bool, len(b.EventIDs))
		at := b.At.UTC().Format(time.RFC3339Nano)
		for i, id := range b.EventIDs {
			if err := record.Event(b.NodeID, id); err != nil {
				return nil, err
			}
			if key, bad := t.unstorable([]any{b.NodeID, id}); bad {
				return nil, t.invalidKey("event", key)
			}
			key := [2]string{b.NodeID, id}
			if _, dup := first[key]; dup {
				continue
			}
			first[key] = place{k, i}
			inc, seq, ok := record.EventSeq(id)
			if !ok {
				inc, seq = "", -1
			}
			nodes, ids, ats = append(nodes, b.NodeID), append(ids, id), append(ats, at)
			incs, seqs = append(incs, inc), append(seqs, seq)
		}
	}
	if len(ids) == 0 {
		return fresh, nil
	}
	var node, id string
	err := t.listRows("event", `INSERT INTO events (node_id, event_id, seen_at, incarnation, seq)
		SELECT e.node, e.id, e.at, NULLIF(e.inc, ''), NULLIF(e.seq, -1)
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[]) AS e(node, id, at, inc, seq)
		WHERE NOT EXISTS (SELECT 1 FROM event_watermarks w
		                  WHERE w.node_id = e.node AND w.incarnation = e.inc AND w.seq >= e.seq)
		ON CONFLICT (node_id, event_id) DO NOTHING
		RETURNING node_id, event_id`, []any{nodes, ids, ats, incs, seqs},
		func() error {
			if p, ok := first[[2]string{node, id}]; ok {
				fresh[p.batch][p.index] = true
			}
			return nil
		}, &node, &id)
	if err != nil {
		return nil, err
	}
	return fresh, nil
}
