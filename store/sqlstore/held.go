package sqlstore

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/mercator/mercator/failure"
)

// Writes held back to travel together (PostgreSQL, UpdateLocked).
//
// Every statement of a transaction is a round trip to PostgreSQL, and the
// rows a locked transaction read stay locked across each. A chunk of
// placements checked its scheduling epoch, read its nodes and runs, and
// wrote its operations, its runs and their node index: eight round trips
// with BEGIN and COMMIT, six of them under its node locks. With PostgreSQL
// on another machine each is at least the network's round trip; held, a
// chunk is five, three under its locks, and commits 1.45x as many chunks a
// second at 0.5-2 ms of added latency (TestPostgresPlacementBench). On one
// 2-core machine shared with the fleet it changed nothing: there each round
// trip waits for the control plane's turn on a core (docs/performance.md,
// "What the leader waits on").
//
// The writes whose outcome the transaction already knows are held and sent
// as one statement (data-modifying WITH queries), just before the next
// statement that is not one of them, or before the commit:
//   - PutOperations: an upsert, it cannot miss;
//   - PutRuns of runs this transaction read (locked) or wrote: they exist,
//     so the update cannot miss either; its node index rows go with it;
//   - CheckEpoch: the check is made, its row locked FOR SHARE, in the same
//     statement as the writes, so a transaction checking a superseded epoch
//     still commits nothing. Lead still waits for any transaction holding
//     the lock; one that has not taken it yet sees the new epoch and fails.
//
// Reads see every write before them: any other statement sends what is held
// first. Two held writes never touch one table (a second write to a table
// sends the first), because PostgreSQL applies at most one change to a row
// per statement. A failed send fails the statement that caused it, or the
// commit; the transaction is then aborted and commits nothing.
type held struct {
	writes []heldWrite
	tables map[string]bool
	epochs []int64
	// err is the first failed send, which aborted the transaction: the
	// commit returns it rather than PostgreSQL's "transaction is aborted".
	err error
}

// heldWrite is one statement held back. Its query numbers its parameters
// from $1 and holds no other '$' (every query of this package is a
// constant).
type heldWrite struct {
	table, query string
	args         []any
	// returns, when not negative, is how many rows the statement must
	// return (its RETURNING clause): fewer is failure.ErrNotFound.
	returns  int
	what, id string
}

// hold holds a unit of writes (several statements a caller knows touch
// different rows), sending what is held first if the unit writes a table
// already held.
func (t *txn) hold(unit ...heldWrite) error {
	h := t.held
	for _, w := range unit {
		if h.tables[w.table] {
			if err := t.sendHeld(false); err != nil {
				return err
			}
			break
		}
	}
	for _, w := range unit {
		h.tables[w.table] = true
	}
	h.writes = append(h.writes, unit...)
	return nil
}

// holding reports whether this transaction holds writes back.
func (t *txn) holding() bool { return t.held != nil }

// sendHeld sends the held writes as one statement, with the held epoch
// checks when commit is set (they wait for the last send, so that they ride
// with the writes). It is called before every other statement and before
// the commit.
func (t *txn) sendHeld(commit bool) error {
	h := t.held
	if h == nil {
		return nil
	}
	if h.err != nil {
		return h.err
	}
	epochs := []int64(nil)
	if commit {
		epochs = h.epochs
	}
	if len(h.writes) == 0 && len(epochs) == 0 {
		return nil
	}
	writes := h.writes
	h.writes = nil
	if commit {
		h.epochs = nil
	}
	clear(h.tables)
	query, args, cols := heldStatement(writes, len(epochs) > 0)
	counts, dest := make([]int64, cols), make([]any, cols)
	for i := range counts {
		dest[i] = &counts[i]
	}
	if err := t.tx.QueryRowContext(t.ctx, query, args...).Scan(dest...); err != nil {
		what, id := "scheduling epoch", "1" // an epoch check alone
		if len(writes) > 0 {
			what, id = writes[0].what, writes[0].id
		}
		h.err = t.dbError(err, "write", what, id)
		return h.err
	}
	i := 0
	for _, w := range writes {
		if w.returns < 0 {
			continue
		}
		if counts[i] != int64(w.returns) {
			h.err = failure.NotFound(w.what, fmt.Sprintf("one of %d written with %q", w.returns, w.id))
			return h.err
		}
		i++
	}
	if len(epochs) > 0 {
		current := counts[i]
		for _, e := range epochs {
			if e != current {
				h.err = failure.Fenced("scheduling epoch %d is over: another replica has scheduled since, under epoch %d", e, current)
				return h.err
			}
		}
	}
	return nil
}

// heldStatement is writes as one statement, its arguments and how many
// columns its row has: each write a WITH query, the row the count of rows
// each returning write returned and, with epoch, the current scheduling
// epoch read FOR SHARE (or a constant 1 when there is neither).
func heldStatement(writes []heldWrite, epoch bool) (query string, args []any, cols int) {
	var b strings.Builder
	var row []string
	for i, w := range writes {
		if i == 0 {
			b.WriteString("WITH ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "w%d AS (%s)", i, renumber(w.query, len(args)))
		args = append(args, w.args...)
		if w.returns >= 0 {
			row = append(row, fmt.Sprintf("(SELECT count(*) FROM w%d)", i))
		}
	}
	if epoch {
		if len(writes) == 0 {
			b.WriteString("WITH ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString("e AS (SELECT epoch FROM scheduling_epoch WHERE id = 1 FOR SHARE)")
		row = append(row, "COALESCE((SELECT epoch FROM e), 0)")
	}
	if len(row) == 0 {
		row = append(row, "1")
	}
	b.WriteString(" SELECT ")
	b.WriteString(strings.Join(row, ", "))
	return b.String(), args, len(row)
}

// renumber adds by to the number of every parameter ($N) in query.
func renumber(query string, by int) string {
	if by == 0 {
		return query
	}
	var b strings.Builder
	for {
		i := strings.IndexByte(query, '$')
		if i < 0 {
			b.WriteString(query)
			return b.String()
		}
		j := i + 1
		for j < len(query) && query[j] >= '0' && query[j] <= '9' {
			j++
		}
		b.WriteString(query[:i+1])
		if n, err := strconv.Atoi(query[i+1 : j]); err == nil {
			b.WriteString(strconv.Itoa(n + by))
		}
		query = query[j:]
	}
}
