package memstore

import (
	"cmp"
	"slices"
	"time"

	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// prune deletes, from the named table, up to limit records that doomed
// accepts, in the order of at (then key): the retention rules' one
// shape here.
func prune[T any](t *tx, name string, m *map[string][]byte, what string, limit int,
	doomed func(T) (at int64, ok bool)) (int, error) {
	if err := record.PruneLimit(limit); err != nil {
		return 0, err
	}
	if err := t.writable(); err != nil {
		return 0, err
	}
	type victim struct {
		at  int64
		key string
	}
	var vs []victim
	for key, b := range *m {
		v, err := decode[T](what, key, b)
		if err != nil {
			return 0, err
		}
		if at, ok := doomed(v); ok {
			vs = append(vs, victim{at, key})
		}
	}
	slices.SortFunc(vs, func(a, b victim) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.key, b.key)) })
	vs = vs[:min(len(vs), limit)]
	if len(vs) > 0 {
		tbl := table(t, name, m)
		for _, v := range vs {
			delete(tbl, v.key)
		}
	}
	return len(vs), nil
}

func (t *tx) PruneRuns(before time.Time, limit int) (int, bool, error) {
	if err := record.PruneLimit(limit); err != nil {
		return 0, false, err
	}
	if err := t.writable(); err != nil {
		return 0, false, err
	}
	var doomed []store.Run
	for id, b := range t.st.runs {
		r, err := decode[store.Run]("run", id, b)
		if err != nil {
			return 0, false, err
		}
		if sec, ok := record.RunFinished(r); ok && record.Before(sec, before) {
			doomed = append(doomed, r)
		}
	}
	slices.SortFunc(doomed, func(a, b store.Run) int {
		as, _ := record.RunFinished(a)
		bs, _ := record.RunFinished(b)
		return cmp.Or(cmp.Compare(as, bs), cmp.Compare(a.ID, b.ID))
	})
	// Each log counts as one piece toward limit, then the run itself.
	budget, runs := limit, 0
	for _, r := range doomed {
		for key := range t.st.logs {
			if key.RunID != r.ID {
				continue
			}
			if budget == 0 {
				return runs, true, nil
			}
			delete(table(t, "logs", &t.st.logs), key)
			budget--
		}
		if budget == 0 {
			return runs, true, nil
		}
		delete(table(t, "runs", &t.st.runs), r.ID)
		budget--
		runs++
	}
	return runs, false, nil
}

func (t *tx) PruneOperations(before time.Time, limit int) (int, error) {
	return prune(t, "operations", &t.st.operations, "operation", limit, func(op store.Operation) (int64, bool) {
		return op.CreatedAt.Unix(), op.Result != nil && record.Before(op.CreatedAt.Unix(), before)
	})
}

func (t *tx) PruneCalls(before time.Time, limit int) (int, error) {
	return prune(t, "fn_calls", &t.st.functions.calls, "call", limit, func(c store.Call) (int64, bool) {
		return c.CreatedAt.Unix(), !c.Pending() && record.Before(c.CreatedAt.Unix(), before)
	})
}

func (t *tx) PruneSessions(before time.Time, limit int) (int, error) {
	return prune(t, "sessions", &t.st.sessions, "session", limit, func(s store.Session) (int64, bool) {
		return s.ExpiresAt.Unix(), record.Before(s.ExpiresAt.Unix(), before)
	})
}

func (t *tx) PruneInvitations(before time.Time, limit int) (int, error) {
	return prune(t, "invitations", &t.st.invitations, "invitation", limit, func(inv store.Invitation) (int64, bool) {
		done := record.InvitationDone(inv)
		return done, record.Before(done, before)
	})
}

func (t *tx) AdvanceEventWatermark(nodeID, eventID string) error {
	inc, seq, err := record.Watermark(nodeID, eventID)
	if err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	k := eventKey{nodeID, inc}
	if have, ok := t.st.watermarks[k]; ok && have >= seq {
		return nil
	}
	table(t, "watermarks", &t.st.watermarks)[k] = seq
	return nil
}

// belowWatermark reports whether the event is at or below its node's
// watermark, and so seen whether or not its row is kept.
func (t *tx) belowWatermark(nodeID, eventID string) bool {
	inc, seq, ok := record.EventSeq(eventID)
	if !ok {
		return false
	}
	w, ok := t.st.watermarks[eventKey{nodeID, inc}]
	return ok && seq <= w
}

func (t *tx) PruneEvents(limit int) (int, error) {
	if err := record.PruneLimit(limit); err != nil {
		return 0, err
	}
	if err := t.writable(); err != nil {
		return 0, err
	}
	n := 0
	for k := range t.st.events {
		if n == limit {
			break
		}
		if t.belowWatermark(k.node, k.event) {
			delete(table(t, "events", &t.st.events), k)
			n++
		}
	}
	return n, nil
}
