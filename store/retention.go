package store

import "time"

// RetentionTx is the part of Tx that deletes what the control plane no
// longer needs, so that nothing it stores grows without end. Each Prune
// deletes at most limit items (limit must be positive) and reports how
// many it deleted: a caller sweeping a large backlog calls it again, in a
// new transaction, while it deletes limit, so that no transaction holds a
// long delete. Times are compared in whole seconds (a record is pruned
// when its time's second is before before's).
//
// Nothing here deletes what may still be used: a run that is not terminal,
// an operation without its result, a call that may still be delivered.
type RetentionTx interface {
	// PruneRuns deletes runs that are terminal and finished before before,
	// earliest finished first, with their attempts' logs (the attempts are
	// part of the run record). limit bounds runs and pieces of log together
	// (a store holds a log in pieces, SQL stores as chunks); a run is
	// deleted only once its logs are, so a limit reached in the middle of a
	// long log leaves the run and the rest of its log for the next call. It
	// reports how many runs it deleted and whether it stopped at limit
	// (more: call again).
	PruneRuns(before time.Time, limit int) (runs int, more bool, err error)
	// PruneOperations deletes operations that have their result and were
	// created before before. An operation without its result is still owed
	// to its node and is never deleted.
	PruneOperations(before time.Time, limit int) (int, error)
	// PruneCalls deletes durable calls that are no longer pending (Pending)
	// and were created before before, their request, answer and log with
	// them.
	PruneCalls(before time.Time, limit int) (int, error)
	// PruneSessions deletes node sessions that expired before before.
	PruneSessions(before time.Time, limit int) (int, error)
	// PruneInvitations deletes invitations spent, or expired, before
	// before.
	PruneInvitations(before time.Time, limit int) (int, error)

	// AdvanceEventWatermark records the node's declaration that every event
	// of eventID's incarnation at or below eventID's sequence was either
	// applied or will never be sent (nodeproto.EventBatch.Through), and
	// raises the node's watermark for that incarnation to it; a lower one
	// changes nothing. From then on SeeEvent reports any such event as
	// seen, row or no row, which is what lets PruneEvents delete the rows.
	// An eventID that nodeproto.ParseEventID cannot split is ErrInvalid.
	AdvanceEventWatermark(nodeID, eventID string) error
	// PruneEvents deletes de-duplication rows (SeeEvent's) at or below
	// their node's watermark for their incarnation. Rows of IDs that have
	// no sequence, or of incarnations without a watermark, are kept.
	PruneEvents(limit int) (int, error)
}
