package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

var (
	errReadOnly = errors.New("sqlstore: write in a read-only transaction")
	errTxDone   = errors.New("sqlstore: transaction used after it ended")
)

// txn is a store.Tx over one database transaction. It is not safe for
// concurrent use, as a *sql.Tx used for reading rows is not.
type txn struct {
	ctx   context.Context
	tx    *sql.Tx
	d     *dialect
	stmts *stmtCache // nil: statements are not cached (PostgreSQL)
	// lockRows makes every getDoc read lock its row (FOR UPDATE): the
	// transaction is an UpdateLocked one under READ COMMITTED.
	lockRows bool
	write    bool
	done     bool
	// conflict is the first retryable error a statement met (see
	// Store.Update): after it, a PostgreSQL transaction is aborted, and
	// whatever fn returns, running fn again is the answer.
	conflict error
	// runNodes is, for runs this transaction read or wrote, the nodes
	// run_nodes holds for them as of now (record.NodeIDs), so that PutRun
	// writes only the rows that change: most writes of a run (an
	// observation, a result) change none, and rewriting its rows was two
	// statements each.
	runNodes map[string][]string
	// held is the writes held back to travel together (held.go):
	// PostgreSQL's UpdateLocked transactions; nil otherwise.
	held *held
}

// noteRunNodes records r's indexed nodes (see txn.runNodes).
func (t *txn) noteRunNodes(id string, nodes []string) {
	if t.runNodes == nil {
		t.runNodes = map[string][]string{}
	}
	t.runNodes[id] = nodes
}

// note records err if it is a conflict worth running fn again for, and
// returns it.
func (t *txn) note(err error) error {
	if err != nil && t.conflict == nil && t.d.retryable(err) {
		t.conflict = err
	}
	return err
}

// unstorable returns the first string in args that the database cannot
// hold as TEXT: with PostgreSQL, one that is not valid UTF-8 or contains
// NUL. No record can have been stored under such a key, so a read by it
// finds nothing and a write with it is invalid. Catching it here keeps the
// error from reaching PostgreSQL, where it would abort the transaction, and
// keeps the answers those of SQLite and memstore for every key they share.
func (t *txn) unstorable(args []any) (string, bool) {
	if !t.d.textIsUTF8 {
		return "", false
	}
	for _, a := range args {
		if s, ok := a.(string); ok && (!utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0) {
			return s, true
		}
	}
	return "", false
}

func (t *txn) invalidKey(what, key string) error {
	return failure.Invalid("key", "%s key %q is not valid UTF-8 text without NUL, which the %s store cannot hold",
		what, key, t.d.name)
}

func (t *txn) readable() error {
	if t.done {
		return errTxDone
	}
	return nil
}

func (t *txn) writable() error {
	if t.done {
		return errTxDone
	}
	if !t.write {
		return errReadOnly
	}
	return nil
}

// dbError wraps a database error from doing op on the record what/id, as a
// conflict when the database reports a unique violation.
func (t *txn) dbError(err error, op, what, id string) error {
	t.note(err)
	if t.d.uniqueViolation(err) {
		return failure.Conflict("%s %q already exists (%v)", what, id, err)
	}
	return fmt.Errorf("sqlstore: %s %s %q: %w", op, what, id, err)
}

func (t *txn) exec(op, what, id, query string, args ...any) (sql.Result, error) {
	if key, bad := t.unstorable(args); bad {
		return nil, t.invalidKey(what, key)
	}
	res, err := t.execContext(query, args...)
	if err != nil {
		return nil, t.dbError(err, op, what, id)
	}
	return res, nil
}

// affected runs query and returns how many rows it changed.
func (t *txn) affected(op, what, id, query string, args ...any) (int64, error) {
	res, err := t.exec(op, what, id, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, t.dbError(err, op, what, id)
	}
	return n, nil
}

func encode(what, id string, v any) (string, error) {
	b, err := record.Encode(v)
	if err != nil {
		return "", fmt.Errorf("sqlstore: encode %s %q: %w", what, id, err)
	}
	return string(b), nil
}

func decode[T any](what, id string, doc []byte) (T, error) {
	v, err := record.Decode[T](doc)
	if err != nil {
		return v, fmt.Errorf("sqlstore: decode %s %q: %w", what, id, err)
	}
	return v, nil
}

// getDoc returns the record the one-column, at-most-one-row query finds.
func getDoc[T any](t *txn, what, id, query string, args ...any) (T, error) {
	var zero T
	var doc []byte
	if err := t.getRow(what, id, query, args, &doc); err != nil {
		return zero, err
	}
	return decode[T](what, id, doc)
}

// getRow scans the one row query finds into dest: failure.ErrNotFound
// when there is none. In an UpdateLocked transaction the row is locked.
func (t *txn) getRow(what, id, query string, args []any, dest ...any) error {
	if err := t.readable(); err != nil {
		return err
	}
	if _, bad := t.unstorable(args); bad {
		return failure.NotFound(what, id)
	}
	if t.lockRows {
		query += " FOR UPDATE"
	}
	err := t.queryRowContext(query, args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return failure.NotFound(what, id)
	}
	if err != nil {
		return t.dbError(err, "get", what, id)
	}
	return nil
}

// listDocs returns the records a query of (id, doc) rows finds, in order.
// The result is never nil.
func listDocs[T any](t *txn, what, query string, args ...any) ([]T, error) {
	out := []T{}
	var id string
	var doc []byte
	err := t.listRows(what, query, args, func() error {
		v, err := decode[T](what, id, doc)
		out = append(out, v)
		return err
	}, &id, &doc)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// listRows scans each row query finds into dest and calls each after it.
func (t *txn) listRows(what, query string, args []any, each func() error, dest ...any) error {
	if err := t.readable(); err != nil {
		return err
	}
	if _, bad := t.unstorable(args); bad {
		return nil
	}
	rows, err := t.queryContext(query, args...)
	if err != nil {
		return fmt.Errorf("sqlstore: list %ss: %w", what, t.note(err))
	}
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("sqlstore: list %ss: %w", what, t.note(err))
		}
		if err := each(); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sqlstore: list %ss: %w", what, t.note(err))
	}
	return nil
}

// create runs an INSERT … ON CONFLICT DO NOTHING and reports a conflict if
// it inserted nothing. Unlike catching the constraint error, this leaves a
// PostgreSQL transaction usable after the conflict.
func (t *txn) create(what, id, query string, args ...any) error {
	n, err := t.affected("create", what, id, query, args...)
	if err != nil {
		return err
	}
	if n == 0 {
		return failure.Conflict("%s %q already exists", what, id)
	}
	return nil
}

// replace runs an UPDATE and reports not found if it changed nothing.
func (t *txn) replace(what, id, query string, args ...any) error {
	n, err := t.affected("replace", what, id, query, args...)
	if err != nil {
		return err
	}
	if n == 0 {
		return failure.NotFound(what, id)
	}
	return nil
}

func (t *txn) CreateInvitation(inv store.Invitation) error {
	if err := record.Invitation(inv); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("invitation", inv.TokenHash, inv)
	if err != nil {
		return err
	}
	return t.create("invitation", inv.TokenHash,
		`INSERT INTO invitations (token_hash, node_id, doc, done_sec) VALUES ($1, $2, $3, $4) ON CONFLICT (token_hash) DO NOTHING`,
		inv.TokenHash, inv.NodeID, doc, record.InvitationDone(inv))
}

func (t *txn) GetInvitation(tokenHash string) (store.Invitation, error) {
	return getDoc[store.Invitation](t, "invitation", tokenHash,
		`SELECT doc FROM invitations WHERE token_hash = $1`, tokenHash)
}

func (t *txn) PutInvitation(inv store.Invitation) error {
	if err := record.Invitation(inv); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("invitation", inv.TokenHash, inv)
	if err != nil {
		return err
	}
	return t.replace("invitation", inv.TokenHash,
		`UPDATE invitations SET node_id = $2, doc = $3, done_sec = $4 WHERE token_hash = $1`,
		inv.TokenHash, inv.NodeID, doc, record.InvitationDone(inv))
}

func (t *txn) ListInvitations(nodeID string) ([]store.Invitation, error) {
	invs, err := listDocs[store.Invitation](t, "invitation",
		`SELECT token_hash, doc FROM invitations WHERE node_id = $1`, nodeID)
	record.SortInvitations(invs)
	return invs, err
}

func (t *txn) DeleteInvitation(tokenHash string) error {
	return t.deleteByKey("invitations", "token_hash", "invitation", tokenHash)
}

func (t *txn) PutSession(s store.Session) error {
	if err := record.Session(s); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("session", s.TokenHash, s)
	if err != nil {
		return err
	}
	_, err = t.exec("put", "session", s.TokenHash,
		`INSERT INTO sessions (token_hash, node_id, doc, expires_sec) VALUES ($1, $2, $3, $4)
		 ON CONFLICT (token_hash) DO UPDATE SET node_id = excluded.node_id, doc = excluded.doc, expires_sec = excluded.expires_sec`,
		s.TokenHash, s.NodeID, doc, s.ExpiresAt.Unix())
	return err
}

func (t *txn) GetSession(tokenHash string) (store.Session, error) {
	return getDoc[store.Session](t, "session", tokenHash,
		`SELECT doc FROM sessions WHERE token_hash = $1`, tokenHash)
}

func (t *txn) DeleteSessions(nodeID string) error {
	if err := t.writable(); err != nil {
		return err
	}
	if _, bad := t.unstorable([]any{nodeID}); bad {
		return nil // no session can be stored under it
	}
	_, err := t.exec("delete sessions of", "node", nodeID, `DELETE FROM sessions WHERE node_id = $1`, nodeID)
	return err
}

func (t *txn) CreateRun(r store.Run) error {
	if err := record.Run(r); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("run", r.ID, r)
	if err != nil {
		return err
	}
	if err := t.create("run", r.ID,
		`INSERT INTO runs (id, created_sec, created_nsec, status, doc, finished_sec, project) VALUES ($1, $2, $3, $4, $5, $6, $7)
		 ON CONFLICT (id) DO NOTHING`,
		r.ID, r.CreatedAt.Unix(), r.CreatedAt.Nanosecond(), r.Status, doc, nullable(record.RunFinished(r)), record.RunProject(r)); err != nil {
		return err
	}
	nodes := record.NodeIDs(r)
	if err := t.indexRunNodes(r.ID, nodes); err != nil {
		return err
	}
	t.noteRunNodes(r.ID, nodes)
	return nil
}

func (t *txn) GetRun(id string) (store.Run, error) {
	r, err := getDoc[store.Run](t, "run", id, `SELECT doc FROM runs WHERE id = $1`, id)
	if err == nil && t.write {
		t.noteRunNodes(id, record.NodeIDs(r))
	}
	return r, err
}

func (t *txn) PutRun(r store.Run) error {
	if err := record.Run(r); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("run", r.ID, r)
	if err != nil {
		return err
	}
	if err := t.replace("run", r.ID,
		`UPDATE runs SET created_sec = $2, created_nsec = $3, status = $4, doc = $5, finished_sec = $6, project = $7 WHERE id = $1`,
		r.ID, r.CreatedAt.Unix(), r.CreatedAt.Nanosecond(), r.Status, doc, nullable(record.RunFinished(r)), record.RunProject(r)); err != nil {
		return err
	}
	nodes := record.NodeIDs(r)
	old, known := t.runNodes[r.ID]
	if !known {
		if _, err := t.exec("index", "run", r.ID, `DELETE FROM run_nodes WHERE run_id = $1`, r.ID); err != nil {
			return err
		}
	}
	for _, nodeID := range old {
		if _, keep := slices.BinarySearch(nodes, nodeID); keep {
			continue
		}
		if _, err := t.exec("index", "run", r.ID, `DELETE FROM run_nodes WHERE run_id = $1 AND node_id = $2`, r.ID, nodeID); err != nil {
			return err
		}
	}
	var added []string
	for _, nodeID := range nodes {
		if _, had := slices.BinarySearch(old, nodeID); !had {
			added = append(added, nodeID)
		}
	}
	if err := t.indexRunNodes(r.ID, added); err != nil {
		return err
	}
	t.noteRunNodes(r.ID, nodes)
	return nil
}

// indexRunNodes records that the run has attempts on nodes. Their rows
// must not exist yet.
func (t *txn) indexRunNodes(runID string, nodes []string) error {
	for _, nodeID := range nodes {
		if _, err := t.exec("index", "run", runID,
			`INSERT INTO run_nodes (run_id, node_id) VALUES ($1, $2)`, runID, nodeID); err != nil {
			return err
		}
	}
	return nil
}

func (t *txn) ListRuns(opts store.ListRunsOptions) ([]store.Run, error) {
	if err := t.readable(); err != nil {
		return nil, err
	}
	if err := opts.CheckAnyOrder(); err != nil {
		return nil, err
	}
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if len(opts.Statuses) > 0 {
		var ph []string
		for _, s := range opts.Statuses {
			if _, bad := t.unstorable([]any{s}); !bad { // no run has it
				ph = append(ph, arg(s))
			}
		}
		if len(ph) == 0 {
			ph = append(ph, "NULL") // matches nothing; Before is still checked
		}
		where = append(where, "r.status IN ("+strings.Join(ph, ", ")+")")
	}
	if opts.Project != "" {
		where = append(where, "r.project = "+arg(opts.Project))
	}
	if opts.NodeID != "" {
		// An IN over run_nodes' index, not a correlated EXISTS: SQLite ran
		// that subquery once for every stored run, and every node's session
		// opens with this list (its strays), ten thousand of them at once
		// when a fleet reconnects.
		where = append(where, "r.id IN (SELECT n.run_id FROM run_nodes n WHERE n.node_id = "+arg(opts.NodeID)+")")
	}
	if opts.Before != "" {
		if _, bad := t.unstorable([]any{opts.Before}); bad {
			return nil, failure.NotFound("run", opts.Before)
		}
		var sec, nsec int64
		err := t.queryRowContext(
			`SELECT created_sec, created_nsec FROM runs WHERE id = $1`, opts.Before).Scan(&sec, &nsec)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, failure.NotFound("run", opts.Before)
		}
		if err != nil {
			return nil, t.dbError(err, "list runs before", "run", opts.Before)
		}
		where = append(where, fmt.Sprintf("(r.created_sec, r.created_nsec, r.id) < (%s, %s, %s)",
			arg(sec), arg(nsec), arg(opts.Before)))
	}
	q := "SELECT r.id, r.doc FROM runs r"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	if !opts.AnyOrder {
		q += " ORDER BY r.created_sec DESC, r.created_nsec DESC, r.id DESC"
	}
	if opts.Limit > 0 {
		q += " LIMIT " + arg(opts.Limit)
	}
	return listDocs[store.Run](t, "run", q, args...)
}

func (t *txn) PutOperation(op store.Operation) error {
	if err := record.Operation(op); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("operation", op.ID, op)
	if err != nil {
		return err
	}
	pending := 0
	if op.Result == nil {
		pending = 1
	}
	_, err = t.exec("put", "operation", op.ID,
		`INSERT INTO operations (id, node_id, pending, created_sec, created_nsec, doc) VALUES ($1, $2, $3, $4, $5, $6)
		 ON CONFLICT (id) DO UPDATE SET node_id = excluded.node_id, pending = excluded.pending,
		   created_sec = excluded.created_sec, created_nsec = excluded.created_nsec, doc = excluded.doc`,
		op.ID, op.NodeID, pending, op.CreatedAt.Unix(), op.CreatedAt.Nanosecond(), doc)
	return err
}

func (t *txn) GetOperation(id string) (store.Operation, error) {
	return getDoc[store.Operation](t, "operation", id, `SELECT doc FROM operations WHERE id = $1`, id)
}

func (t *txn) PendingOperations(nodeID string) ([]store.Operation, error) {
	return listDocs[store.Operation](t, "operation",
		`SELECT id, doc FROM operations WHERE node_id = $1 AND pending = 1
		 ORDER BY created_sec, created_nsec, id`, nodeID)
}

// PendingOperationsOf implements store.Tx: one statement where the
// database takes arrays (PostgreSQL), else a read per node.
func (t *txn) PendingOperationsOf(nodeIDs []string) (map[string][]store.Operation, error) {
	if !t.batched() {
		return store.PendingOfEach(nodeIDs, t.PendingOperations)
	}
	out := map[string][]store.Operation{}
	// Ordered by node first: the order the node index (operations_pending)
	// gives, so that no plan walks every pending operation in creation
	// order (operations_done) to filter the few nodes asked for.
	ops, err := listDocs[store.Operation](t, "operation",
		`SELECT id, doc FROM operations WHERE node_id = ANY($1) AND pending = 1
		 ORDER BY node_id, created_sec, created_nsec, id`, t.storable(nodeIDs))
	if err != nil {
		return nil, err
	}
	for _, op := range ops {
		out[op.NodeID] = append(out[op.NodeID], op)
	}
	return out, nil
}

func (t *txn) SeeEvent(nodeID, eventID string, at time.Time) (bool, error) {
	if err := record.Event(nodeID, eventID); err != nil {
		return false, err
	}
	if err := t.writable(); err != nil {
		return false, err
	}
	inc, seq, ok := record.EventSeq(eventID)
	if !ok { // deduplicated by the whole ID only
		n, err := t.affected("see", "event", nodeID+"/"+eventID,
			`INSERT INTO events (node_id, event_id, seen_at) VALUES ($1, $2, $3)
			 ON CONFLICT (node_id, event_id) DO NOTHING`,
			nodeID, eventID, at.UTC().Format(time.RFC3339Nano))
		return n == 1, err
	}
	// Fresh when neither its row nor its node's watermark says it was
	// seen; one statement either way, as before watermarks. The casts
	// type the SELECT's parameters for PostgreSQL.
	n, err := t.affected("see", "event", nodeID+"/"+eventID,
		`INSERT INTO events (node_id, event_id, seen_at, incarnation, seq)
		 SELECT CAST($1 AS TEXT), CAST($2 AS TEXT), CAST($3 AS TEXT), CAST($4 AS TEXT), CAST($5 AS BIGINT)
		 WHERE NOT EXISTS (SELECT 1 FROM event_watermarks w
		                   WHERE w.node_id = $1 AND w.incarnation = $4 AND w.seq >= $5)
		 ON CONFLICT (node_id, event_id) DO NOTHING`,
		nodeID, eventID, at.UTC().Format(time.RFC3339Nano), inc, seq)
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

func logID(key nodeproto.WorkloadKey) string {
	return key.RunID + "/" + strconv.Itoa(key.Attempt)
}

// logSize is the end of the log's last chunk, 0 for a log without chunks.
func (t *txn) logSize(key nodeproto.WorkloadKey) (int64, error) {
	if _, bad := t.unstorable([]any{key.RunID}); bad {
		return 0, nil
	}
	var size int64
	err := t.queryRowContext(
		`SELECT end_offset FROM log_chunks WHERE run_id = $1 AND attempt = $2
		 ORDER BY start_offset DESC LIMIT 1`, key.RunID, key.Attempt).Scan(&size)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, t.dbError(err, "size", "log", logID(key))
	}
	return size, nil
}

func (t *txn) AppendLog(key nodeproto.WorkloadKey, offset int64, data []byte) (int64, error) {
	if err := record.LogKey(key, offset); err != nil {
		return 0, err
	}
	if err := t.writable(); err != nil {
		return 0, err
	}
	size, err := t.logSize(key)
	if err != nil {
		return 0, err
	}
	tail := record.LogTail(size, offset, data)
	if len(tail) == 0 {
		return size, nil
	}
	end := size + int64(len(tail))
	if _, err := t.exec("append", "log", logID(key),
		`INSERT INTO log_chunks (run_id, attempt, start_offset, end_offset, data) VALUES ($1, $2, $3, $4, $5)`,
		key.RunID, key.Attempt, size, end, tail); err != nil {
		return 0, err
	}
	return end, nil
}

func (t *txn) ReadLog(key nodeproto.WorkloadKey, offset int64, max int) ([]byte, int64, error) {
	if err := record.LogKey(key, offset); err != nil {
		return nil, 0, err
	}
	if err := record.ReadMax(key, max); err != nil {
		return nil, 0, err
	}
	if err := t.readable(); err != nil {
		return nil, 0, err
	}
	size, err := t.logSize(key)
	if err != nil {
		return nil, 0, err
	}
	if offset >= size || max == 0 {
		return []byte{}, size, nil
	}
	end := min(size, offset+int64(max))
	// Chunks are contiguous, so the first one needed is the last that
	// starts at or before offset; both bounds are seeks on the primary key.
	rows, err := t.queryContext(
		`SELECT start_offset, data FROM log_chunks
		 WHERE run_id = $1 AND attempt = $2 AND start_offset < $4
		   AND start_offset >= (SELECT MAX(start_offset) FROM log_chunks
		                        WHERE run_id = $1 AND attempt = $2 AND start_offset <= $3)
		 ORDER BY start_offset`, key.RunID, key.Attempt, offset, end)
	if err != nil {
		return nil, 0, t.dbError(err, "read", "log", logID(key))
	}
	defer rows.Close()
	out := make([]byte, 0, end-offset)
	for rows.Next() {
		var start int64
		var chunk sql.RawBytes
		if err := rows.Scan(&start, &chunk); err != nil {
			return nil, 0, t.dbError(err, "read", "log", logID(key))
		}
		lo := min(int64(len(chunk)), offset-min(offset, start))
		hi := min(int64(len(chunk)), end-start)
		out = append(out, chunk[lo:hi]...)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, t.dbError(err, "read", "log", logID(key))
	}
	if int64(len(out)) != end-offset {
		return nil, 0, fmt.Errorf("sqlstore: log %s: read %d bytes at %d, want %d: chunks are not contiguous",
			logID(key), len(out), offset, end-offset)
	}
	return out, size, nil
}
