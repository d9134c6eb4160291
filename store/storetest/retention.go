package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// finishedRun is a terminal run that finished at finished, with an
// attempt on node-a.
func finishedRun(id string, finished time.Time, status string) store.Run {
	r := sampleRun(id, finished.Add(-time.Hour), status, "node-a")
	r.FinishedAt = ptr(finished)
	r.UpdatedAt = finished
	return r
}

// testPruneRuns: terminal runs finished before the cutoff go, earliest
// first, with their logs; newer ones and runs that are not terminal stay,
// however old; the limit bounds runs and log pieces together, and a run
// is never left without part of its log.
func testPruneRuns(t *testing.T, s store.Store) {
	old := at(-40 * 24 * time.Hour)
	cutoff := at(-30 * 24 * time.Hour)
	runs := []store.Run{
		finishedRun("run-old-1", old, api.RunSucceeded),
		finishedRun("run-old-2", old.Add(time.Hour), api.RunFailed),
		finishedRun("run-new", at(-time.Hour), api.RunCancelled),
		sampleRun("run-running", old.Add(-time.Hour), api.RunRunning, "node-a"),
		sampleRun("run-queued", old.Add(-time.Hour), api.RunQueued),
	}
	update(t, s, func(tx store.Tx) error {
		for _, r := range runs {
			must(t, tx.CreateRun(r))
			for attempt := 1; attempt <= 2; attempt++ {
				key := nodeproto.WorkloadKey{RunID: r.ID, Attempt: attempt}
				for i := range 3 {
					_, err := tx.AppendLog(key, int64(i*5), []byte("line\n"))
					must(t, err)
				}
			}
		}
		return nil
	})
	// A limit of 1 deletes one piece of run-old-1's log and nothing else.
	update(t, s, func(tx store.Tx) error {
		n, more, err := tx.PruneRuns(cutoff, 1)
		must(t, err)
		if n != 0 || !more {
			t.Errorf("PruneRuns limit 1 = %d runs, more %v; want 0, true", n, more)
		}
		if _, err := tx.GetRun("run-old-1"); err != nil {
			t.Errorf("run-old-1 deleted before its whole log: %v", err)
		}
		return nil
	})
	// Then batches of 4 until done: both old runs go, earliest first.
	total, calls := 0, 0
	for more := true; more; calls++ {
		update(t, s, func(tx store.Tx) error {
			var n int
			var err error
			n, more, err = tx.PruneRuns(cutoff, 4)
			total += n
			return err
		})
		if calls > 10 {
			t.Fatal("PruneRuns keeps reporting more")
		}
	}
	if total != 2 {
		t.Errorf("PruneRuns deleted %d runs, want 2", total)
	}
	view(t, s, func(tx store.Tx) error {
		for _, id := range []string{"run-old-1", "run-old-2"} {
			if _, err := tx.GetRun(id); !errors.Is(err, failure.ErrNotFound) {
				t.Errorf("GetRun(%s) after pruning: %v, want not found", id, err)
			}
			for attempt := 1; attempt <= 2; attempt++ {
				_, size, err := tx.ReadLog(nodeproto.WorkloadKey{RunID: id, Attempt: attempt}, 0, 0)
				must(t, err)
				if size != 0 {
					t.Errorf("log of %s attempt %d still holds %d bytes", id, attempt, size)
				}
			}
		}
		for _, id := range []string{"run-new", "run-running", "run-queued"} {
			if _, err := tx.GetRun(id); err != nil {
				t.Errorf("GetRun(%s) after pruning: %v, want kept", id, err)
			}
			_, size, err := tx.ReadLog(nodeproto.WorkloadKey{RunID: id, Attempt: 1}, 0, 0)
			must(t, err)
			if size != 15 {
				t.Errorf("log of kept %s holds %d bytes, want 15", id, size)
			}
		}
		wantIDs(t, "runs on node-a after pruning",
			runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: "node-a"}))),
			[]string{"run-new", "run-running"})
		return nil
	})
	// A run that becomes terminal later is pruned by when it finished.
	update(t, s, func(tx store.Tx) error {
		r := must1[store.Run](t)(tx.GetRun("run-running"))
		r.Status, r.FinishedAt = api.RunSucceeded, ptr(old)
		must(t, tx.PutRun(r))
		n, more, err := tx.PruneRuns(cutoff, 100)
		must(t, err)
		if n != 1 || more {
			t.Errorf("PruneRuns after finishing = %d, more %v; want 1, false", n, more)
		}
		_, _, err = tx.PruneRuns(cutoff, 0)
		wantKind(t, err, failure.ErrInvalid, "limit")
		return nil
	})
}

// testPruneRecords: operations with results, calls no longer pending,
// expired sessions and spent or expired invitations go when older than the
// cutoff, in batches of at most limit; the rest stay.
func testPruneRecords(t *testing.T, s store.Store) {
	cutoff := at(0)
	update(t, s, func(tx store.Tx) error {
		for i, created := range []time.Time{at(-3 * time.Hour), at(-2 * time.Hour), at(time.Hour)} {
			op := sampleOperation(string(rune('a'+i))+"-done", "node-a", created)
			op.Result = &nodeproto.Result{OperationID: op.ID, Kind: op.Command.Kind, Outcome: nodeproto.OutcomeOK, At: created}
			must(t, tx.PutOperation(op))
		}
		must(t, tx.PutOperation(sampleOperation("pending", "node-a", at(-5*time.Hour))))
		must(t, tx.CreateCall(sampleCall("call-1", "fn-1", at(-3*time.Hour), api.CallSuccess, at(-3*time.Hour))))
		must(t, tx.CreateCall(sampleCall("call-2", "fn-1", at(-2*time.Hour), api.CallError, at(-2*time.Hour))))
		must(t, tx.CreateCall(sampleCall("call-queued", "fn-1", at(-4*time.Hour), api.CallQueued, at(-4*time.Hour))))
		must(t, tx.CreateCall(sampleCall("call-new", "fn-1", at(time.Hour), api.CallSuccess, at(time.Hour))))
		expired := sampleSession("sess-expired", "node-a")
		expired.ExpiresAt = at(-time.Minute)
		must(t, tx.PutSession(expired))
		must(t, tx.PutSession(sampleSession("sess-live", "node-a")))
		spent := sampleInvitation("inv-spent", "node-a")
		spent.SpentAt = ptr(at(-2 * time.Hour))
		must(t, tx.CreateInvitation(spent))
		lapsed := sampleInvitation("inv-lapsed", "node-a")
		lapsed.ExpiresAt = at(-time.Hour)
		must(t, tx.CreateInvitation(lapsed))
		must(t, tx.CreateInvitation(sampleInvitation("inv-open", "node-a")))
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		check := func(what string, want int) func(int, error) {
			return func(n int, err error) {
				t.Helper()
				must(t, err)
				if n != want {
					t.Errorf("%s deleted %d, want %d", what, n, want)
				}
			}
		}
		check("PruneOperations limit 1", 1)(tx.PruneOperations(cutoff, 1))
		check("PruneOperations", 1)(tx.PruneOperations(cutoff, 10))
		check("PruneCalls limit 1", 1)(tx.PruneCalls(cutoff, 1))
		check("PruneCalls", 1)(tx.PruneCalls(cutoff, 10))
		check("PruneSessions", 1)(tx.PruneSessions(cutoff, 10))
		check("PruneInvitations limit 1", 1)(tx.PruneInvitations(cutoff, 1))
		check("PruneInvitations", 1)(tx.PruneInvitations(cutoff, 10))
		check("PruneInvitations again", 0)(tx.PruneInvitations(cutoff, 10))
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		wantIDs(t, "pending operations", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-a"))), []string{"pending"})
		if _, err := tx.GetOperation("a-done"); !errors.Is(err, failure.ErrNotFound) {
			t.Errorf("the oldest done operation: %v, want pruned", err)
		}
		must1[store.Operation](t)(tx.GetOperation("c-done"))
		wantIDs(t, "calls left", callIDs(must1[[]store.Call](t)(tx.ListCalls(store.ListFnOptions{FnID: "fn-1"}))),
			[]string{"call-new", "call-queued"})
		must1[store.Session](t)(tx.GetSession("sess-live"))
		if _, err := tx.GetSession("sess-expired"); !errors.Is(err, failure.ErrNotFound) {
			t.Errorf("expired session: %v, want pruned", err)
		}
		wantIDs(t, "invitations left", ids(must1[[]store.Invitation](t)(tx.ListInvitations("node-a")),
			func(i store.Invitation) string { return i.TokenHash }), []string{"inv-open"})
		return nil
	})
}

// testEventWatermark: an event at or below its node's watermark for its
// incarnation is seen whether or not its row is kept, so PruneEvents
// deleting those rows leaves a redelivery still recognised. Rows above the
// watermark, of another incarnation or node, or of IDs without a sequence
// are kept.
func testEventWatermark(t *testing.T, s store.Store) {
	id := func(inc string, seq uint64) string { return nodeproto.FormatEventID(inc, seq) }
	seen := func(tx store.Tx, node, ev string) bool {
		t.Helper()
		fresh, err := tx.SeeEvent(node, ev, at(0))
		must(t, err)
		return !fresh
	}
	update(t, s, func(tx store.Tx) error {
		for seq := uint64(1); seq <= 5; seq++ {
			if seen(tx, "node-a", id("aaaa", seq)) || seen(tx, "node-b", id("aaaa", seq)) {
				t.Fatalf("event %d seen before it was sent", seq)
			}
		}
		if seen(tx, "node-a", id("bbbb", 1)) || seen(tx, "node-a", "opaque") {
			t.Fatal("another incarnation's event, or an opaque ID, seen before it was sent")
		}
		must(t, tx.AdvanceEventWatermark("node-a", id("aaaa", 3)))
		must(t, tx.AdvanceEventWatermark("node-a", id("aaaa", 2))) // lower: no change
		wantKind(t, tx.AdvanceEventWatermark("node-a", "opaque"), failure.ErrInvalid, "opaque")
		// Below the watermark and never recorded (sent, then acknowledged
		// by an earlier version): seen by its sequence alone.
		if !seen(tx, "node-a", id("aaaa", 0)) {
			t.Error("an event below the watermark without a row was fresh")
		}
		// The batch form applies the watermark the same way.
		fresh, err := tx.SeeEvents("node-a", []string{id("aaaa", 1), id("bbbb", 2), id("aaaa", 9), "opaque-2"}, at(0))
		must(t, err)
		if want := []bool{false, true, true, true}; !slices.Equal(fresh, want) {
			t.Errorf("SeeEvents around the watermark = %v, want %v", fresh, want)
		}
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		n, err := tx.PruneEvents(2)
		must(t, err)
		if n != 2 {
			t.Errorf("PruneEvents limit 2 deleted %d", n)
		}
		n, err = tx.PruneEvents(100)
		must(t, err)
		if n != 1 {
			t.Errorf("PruneEvents deleted %d more, want 1 (3 rows at or below the watermark)", n)
		}
		n, err = tx.PruneEvents(100)
		must(t, err)
		if n != 0 {
			t.Errorf("PruneEvents deleted %d on a third call", n)
		}
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		for seq := uint64(1); seq <= 5; seq++ {
			if !seen(tx, "node-a", id("aaaa", seq)) {
				t.Errorf("redelivered event %d of node-a applied twice after pruning", seq)
			}
			if !seen(tx, "node-b", id("aaaa", seq)) {
				t.Errorf("node-b's event %d forgotten: another node's watermark pruned it", seq)
			}
		}
		if !seen(tx, "node-a", id("bbbb", 1)) || !seen(tx, "node-a", "opaque") {
			t.Error("another incarnation's event, or an opaque ID, forgotten")
		}
		if seen(tx, "node-a", id("aaaa", 6)) {
			t.Error("an event above the watermark was seen before it was sent")
		}
		return nil
	})
}
