package record

import (
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// The times the retention rules (store.RetentionTx) compare, in Unix
// seconds, derived from a record the same way in every store. ok is false
// when the record is never pruned by time (a run that is not terminal).

// RunFinished is when a terminal run finished: FinishedAt, or, for a
// terminal run without one, its last update.
func RunFinished(r store.Run) (sec int64, ok bool) {
	if !api.Terminal(r.Status) {
		return 0, false
	}
	if r.FinishedAt != nil {
		return r.FinishedAt.Unix(), true
	}
	return r.UpdatedAt.Unix(), true
}

// InvitationDone is when an invitation stopped being usable: when it was
// spent, or when it expires, whichever is first.
func InvitationDone(inv store.Invitation) int64 {
	if inv.SpentAt != nil && inv.SpentAt.Before(inv.ExpiresAt) {
		return inv.SpentAt.Unix()
	}
	return inv.ExpiresAt.Unix()
}

// Before reports whether sec is before t, to the second, as every store
// compares retention times.
func Before(sec int64, t time.Time) bool { return sec < t.Unix() }

// PruneLimit checks a Prune's limit.
func PruneLimit(limit int) error {
	if limit <= 0 {
		return failure.Invalid("limit", "a prune needs a positive limit, not %d", limit)
	}
	return nil
}

// EventSeq splits an event ID for the watermark rules: ok is false for an
// ID without a sequence, which is deduplicated by the whole ID only.
func EventSeq(eventID string) (incarnation string, seq int64, ok bool) {
	inc, s, ok := nodeproto.ParseEventID(eventID)
	return inc, int64(s), ok
}

// Watermark checks AdvanceEventWatermark's arguments and splits the ID.
func Watermark(nodeID, eventID string) (incarnation string, seq int64, err error) {
	if nodeID == "" {
		return "", 0, failure.Invalid("node_id", "an event watermark needs a node")
	}
	inc, seq, ok := EventSeq(eventID)
	if !ok {
		return "", 0, failure.Invalid("through", "%q is not an event ID of the form INCARNATION-SEQUENCE", eventID)
	}
	return inc, seq, nil
}
