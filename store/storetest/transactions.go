package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/store"
)

// testInvalidKeys: a record without its key is refused, not stored under "".
func testInvalidKeys(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		invalid := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, failure.ErrInvalid) {
				t.Errorf("%s: error = %v, want ErrInvalid", what, err)
			}
		}
		invalid("PutNode", tx.PutNode(sampleNode("")))
		invalid("CreateInvitation", tx.CreateInvitation(sampleInvitation("", "node-a")))
		invalid("PutSession without hash", tx.PutSession(sampleSession("", "node-a")))
		invalid("PutSession without node", tx.PutSession(sampleSession("h", "")))
		invalid("CreateRun", tx.CreateRun(sampleRun("", at(0), api.RunQueued)))
		invalid("PutOperation without ID", tx.PutOperation(sampleOperation("", "node-a", at(0))))
		invalid("PutOperation without node", tx.PutOperation(sampleOperation("op", "", at(0))))
		invalid("CreateToken", tx.CreateToken(sampleToken("")))
		_, err := tx.SeeEvent("node-a", "", at(0))
		invalid("SeeEvent", err)
		_, err = tx.AppendLog(nodeproto.WorkloadKey{RunID: "r", Attempt: 1}, -1, []byte("x"))
		invalid("AppendLog negative offset", err)
		_, _, err = tx.ReadLog(nodeproto.WorkloadKey{RunID: "r", Attempt: 1}, 0, -1)
		invalid("ReadLog negative max", err)
		_, err = tx.GetNode("")
		wantKind(t, err, failure.ErrNotFound, "")
		return nil
	})
}

// testCopiesIn: mutating a record after storing it changes nothing stored.
func testCopiesIn(t *testing.T, s store.Store) {
	k := nodeproto.WorkloadKey{RunID: "run-1", Attempt: 1}
	update(t, s, func(tx store.Tx) error {
		n := sampleNode("node-a")
		r := sampleRun("run-1", at(0), api.RunRunning, "node-a")
		op := sampleOperation("op-1", "node-a", at(0))
		data := []byte("hello")
		must(t, tx.PutNode(n))
		must(t, tx.CreateRun(r))
		must(t, tx.PutOperation(op))
		must1[int64](t)(tx.AppendLog(k, 0, data))

		n.Facts.Hostname = "mutated"
		n.Facts.Accelerators[0].UUID = "mutated"
		*n.EnrolledAt = at(99 * time.Hour)
		r.Attempts[0].NodeID = "mutated"
		r.Env["EPOCHS"] = "mutated"
		r.Command[0] = "mutated"
		*r.Attempts[0].ExitCode = 99
		op.Command.LaunchWorkload.GPUs[0] = "mutated"
		op.Command.LaunchWorkload.Env["K"] = "mutated"
		copy(data, "XXXXX")

		// Checked inside the same transaction and after it.
		same(t, "node in tx", must1[store.Node](t)(tx.GetNode("node-a")), sampleNode("node-a"))
		same(t, "run in tx", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunRunning, "node-a"))
		same(t, "operation in tx", must1[store.Operation](t)(tx.GetOperation("op-1")), sampleOperation("op-1", "node-a", at(0)))
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "node", must1[store.Node](t)(tx.GetNode("node-a")), sampleNode("node-a"))
		same(t, "run", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunRunning, "node-a"))
		same(t, "operation", must1[store.Operation](t)(tx.GetOperation("op-1")), sampleOperation("op-1", "node-a", at(0)))
		data, _, err := tx.ReadLog(k, 0, 100)
		must(t, err)
		if string(data) != "hello" {
			t.Errorf("log = %q after mutating the appended slice, want %q", data, "hello")
		}
		return nil
	})
}

// testCopiesOut: mutating a returned record changes nothing stored.
func testCopiesOut(t *testing.T, s store.Store) {
	k := nodeproto.WorkloadKey{RunID: "run-1", Attempt: 1}
	update(t, s, func(tx store.Tx) error {
		must(t, tx.PutNode(sampleNode("node-a")))
		must(t, tx.CreateRun(sampleRun("run-1", at(0), api.RunRunning, "node-a")))
		must(t, tx.PutOperation(sampleOperation("op-1", "node-a", at(0))))
		must(t, tx.PutSession(sampleSession("sess-1", "node-a")))
		must(t, tx.CreateInvitation(sampleInvitation("inv-1", "node-a")))
		must(t, tx.CreateToken(sampleToken("tok-1")))
		must1[int64](t)(tx.AppendLog(k, 0, []byte("hello")))
		return nil
	})
	check := func(tx store.Tx) {
		t.Helper()
		same(t, "node", must1[store.Node](t)(tx.GetNode("node-a")), sampleNode("node-a"))
		same(t, "run", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunRunning, "node-a"))
		same(t, "operation", must1[store.Operation](t)(tx.GetOperation("op-1")), sampleOperation("op-1", "node-a", at(0)))
		same(t, "session", must1[store.Session](t)(tx.GetSession("sess-1")), sampleSession("sess-1", "node-a"))
		same(t, "invitation", must1[store.Invitation](t)(tx.GetInvitation("inv-1")), sampleInvitation("inv-1", "node-a"))
		same(t, "token", must1[store.Token](t)(tx.GetToken("tok-1")), sampleToken("tok-1"))
		data, _, err := tx.ReadLog(k, 0, 100)
		must(t, err)
		if string(data) != "hello" {
			t.Errorf("log = %q after mutating a read, want %q", data, "hello")
		}
	}
	mutate := func(tx store.Tx) {
		t.Helper()
		n := must1[store.Node](t)(tx.GetNode("node-a"))
		n.Facts.Hostname = "mutated"
		n.Facts.Accelerators[0].UUID = "mutated"
		*n.LastSeenAt = at(99 * time.Hour)
		r := must1[store.Run](t)(tx.GetRun("run-1"))
		r.Env["EPOCHS"] = "mutated"
		r.Attempts[0].NodeID = "mutated"
		*r.Attempts[0].StartedAt = at(99 * time.Hour)
		*r.NextCheck = at(99 * time.Hour)
		op := must1[store.Operation](t)(tx.GetOperation("op-1"))
		op.Command.LaunchWorkload.GPUs[0] = "mutated"
		sess := must1[store.Session](t)(tx.GetSession("sess-1"))
		sess.NodeID = "mutated"
		_ = sess
		for _, n := range must1[[]store.Node](t)(tx.ListNodes()) {
			n.Facts.Notes[0] = "mutated"
		}
		for _, r := range must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{})) {
			r.Command[0] = "mutated"
			*r.Attempts[0].ExitCode = 99
		}
		for _, op := range must1[[]store.Operation](t)(tx.PendingOperations("node-a")) {
			op.Command.LaunchWorkload.Env["K"] = "mutated"
		}
		data, _, err := tx.ReadLog(k, 0, 100)
		must(t, err)
		copy(data, "XXXXX")
	}
	update(t, s, func(tx store.Tx) error {
		mutate(tx)
		check(tx)
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		mutate(tx)
		check(tx)
		return nil
	})
}

// testReadYourWrites: a transaction sees its own uncommitted writes.
func testReadYourWrites(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		must(t, tx.CreateRun(sampleRun("run-1", at(0), api.RunQueued)))
		r := must1[store.Run](t)(tx.GetRun("run-1"))
		r.Status = api.RunPlaced
		r.Attempts = append(r.Attempts, api.Attempt{Number: 1, NodeID: "node-a", Status: api.AttemptPlaced, PlacedAt: at(time.Second)})
		must(t, tx.PutRun(r))
		same(t, "run in tx", must1[store.Run](t)(tx.GetRun("run-1")), r)
		wantIDs(t, "ListRuns in tx", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: "node-a", Statuses: []string{api.RunPlaced}}))), []string{"run-1"})
		must(t, tx.PutOperation(sampleOperation("op-1", "node-a", at(0))))
		wantIDs(t, "pending in tx", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-a"))), []string{"op-1"})
		must(t, tx.PutSession(sampleSession("sess-1", "node-a")))
		must(t, tx.DeleteSessions("node-a"))
		_, err := tx.GetSession("sess-1")
		wantKind(t, err, failure.ErrNotFound, "sess-1")
		return nil
	})
}

// testRollback: when fn fails, nothing it did is kept, replacements included.
func testRollback(t *testing.T, s store.Store) {
	k := nodeproto.WorkloadKey{RunID: "run-1", Attempt: 1}
	update(t, s, func(tx store.Tx) error {
		must(t, tx.PutNode(sampleNode("node-a")))
		must(t, tx.CreateRun(sampleRun("run-1", at(0), api.RunRunning, "node-a")))
		must(t, tx.PutSession(sampleSession("sess-1", "node-a")))
		must1[int64](t)(tx.AppendLog(k, 0, []byte("kept")))
		return nil
	})
	err := s.Update(t.Context(), func(tx store.Tx) error {
		n := sampleNode("node-a")
		n.FencingToken = 100
		must(t, tx.PutNode(n))
		must(t, tx.PutNode(sampleNode("node-b")))
		r := must1[store.Run](t)(tx.GetRun("run-1"))
		r.Status = api.RunFailed
		r.Attempts = nil
		must(t, tx.PutRun(r))
		must(t, tx.CreateRun(sampleRun("run-2", at(time.Hour), api.RunQueued, "node-b")))
		must(t, tx.CreateInvitation(sampleInvitation("inv-1", "node-b")))
		must(t, tx.DeleteSessions("node-a"))
		must(t, tx.PutOperation(sampleOperation("op-1", "node-a", at(0))))
		must1[bool](t)(tx.SeeEvent("node-a", "000001", at(0)))
		must1[int64](t)(tx.AppendLog(k, 4, []byte(" and lost")))
		must1[int64](t)(tx.AppendLog(nodeproto.WorkloadKey{RunID: "run-2", Attempt: 1}, 0, []byte("lost")))
		must(t, tx.CreateToken(sampleToken("tok-1")))
		return fmt.Errorf("fn failed: %w", errBoom)
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("Update returned %v, want fn's error", err)
	}
	update(t, s, func(tx store.Tx) error {
		same(t, "node-a", must1[store.Node](t)(tx.GetNode("node-a")), sampleNode("node-a"))
		_, err := tx.GetNode("node-b")
		wantKind(t, err, failure.ErrNotFound, "node-b")
		same(t, "run-1", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunRunning, "node-a"))
		wantIDs(t, "runs on node-a", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: "node-a"}))), []string{"run-1"})
		wantIDs(t, "runs on node-b", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: "node-b"}))), nil)
		_, err = tx.GetRun("run-2")
		wantKind(t, err, failure.ErrNotFound, "run-2")
		_, err = tx.GetInvitation("inv-1")
		wantKind(t, err, failure.ErrNotFound, "inv-1")
		same(t, "session", must1[store.Session](t)(tx.GetSession("sess-1")), sampleSession("sess-1", "node-a"))
		_, err = tx.GetOperation("op-1")
		wantKind(t, err, failure.ErrNotFound, "op-1")
		wantIDs(t, "pending", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-a"))), []string{})
		_, err = tx.GetToken("tok-1")
		wantKind(t, err, failure.ErrNotFound, "tok-1")
		data, size, err := tx.ReadLog(k, 0, 100)
		must(t, err)
		if string(data) != "kept" || size != 4 {
			t.Errorf("log = %q (size %d), want %q", data, size, "kept")
		}
		_, size, err = tx.ReadLog(nodeproto.WorkloadKey{RunID: "run-2", Attempt: 1}, 0, 100)
		must(t, err)
		if size != 0 {
			t.Errorf("rolled-back log has size %d", size)
		}
		// The event was forgotten, so its redelivery is fresh.
		if fresh := must1[bool](t)(tx.SeeEvent("node-a", "000001", at(0))); !fresh {
			t.Error("SeeEvent after a rolled-back SeeEvent is not fresh")
		}
		return nil
	})
}

// testConflictKeepsTxUsable: a Create that conflicts fails alone; the
// transaction goes on and commits the rest.
func testConflictKeepsTxUsable(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error { return tx.CreateRun(sampleRun("run-1", at(0), api.RunQueued)) })
	update(t, s, func(tx store.Tx) error {
		wantKind(t, tx.CreateRun(sampleRun("run-1", at(time.Hour), api.RunFailed)), failure.ErrConflict, "run-1")
		return tx.CreateRun(sampleRun("run-2", at(time.Hour), api.RunQueued))
	})
	view(t, s, func(tx store.Tx) error {
		wantIDs(t, "runs", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{}))), []string{"run-2", "run-1"})
		same(t, "run-1", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunQueued))
		return nil
	})
}

// testPanic: a panic in fn propagates, keeps nothing, and leaves the Store
// usable.
func testPanic(t *testing.T, s store.Store) {
	func() {
		defer func() {
			if recover() == nil {
				t.Error("panic in fn did not propagate")
			}
		}()
		_ = s.Update(t.Context(), func(tx store.Tx) error {
			must(t, tx.PutNode(sampleNode("node-a")))
			panic("storetest: panic in fn")
		})
	}()
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetNode("node-a")
		wantKind(t, err, failure.ErrNotFound, "node-a")
		return tx.PutNode(sampleNode("node-b"))
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "node-b", must1[store.Node](t)(tx.GetNode("node-b")), sampleNode("node-b"))
		return nil
	})
}

// testViewIsReadOnly: writes inside View fail and are not kept.
func testViewIsReadOnly(t *testing.T, s store.Store) {
	_ = s.View(t.Context(), func(tx store.Tx) error {
		if err := tx.PutNode(sampleNode("node-a")); err == nil {
			t.Error("PutNode inside View succeeded")
		}
		if err := tx.CreateRun(sampleRun("run-1", at(0), api.RunQueued)); err == nil {
			t.Error("CreateRun inside View succeeded")
		}
		if _, err := tx.SeeEvent("node-a", "1", at(0)); err == nil {
			t.Error("SeeEvent inside View succeeded")
		}
		if _, err := tx.AppendLog(nodeproto.WorkloadKey{RunID: "run-1"}, 0, []byte("x")); err == nil {
			t.Error("AppendLog inside View succeeded")
		}
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		_, err := tx.GetNode("node-a")
		wantKind(t, err, failure.ErrNotFound, "node-a")
		_, err = tx.GetRun("run-1")
		wantKind(t, err, failure.ErrNotFound, "run-1")
		return nil
	})
}

// testViewSeesCommitted: each View sees everything committed before it
// began, and fn's error comes back from View.
func testViewSeesCommitted(t *testing.T, s store.Store) {
	for i := range 3 {
		id := fmt.Sprintf("run-%d", i)
		update(t, s, func(tx store.Tx) error { return tx.CreateRun(sampleRun(id, at(time.Duration(i)), api.RunQueued)) })
		view(t, s, func(tx store.Tx) error {
			n := len(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{})))
			if n != i+1 {
				t.Errorf("View after %d commits sees %d runs", i+1, n)
			}
			same(t, id, must1[store.Run](t)(tx.GetRun(id)), sampleRun(id, at(time.Duration(i)), api.RunQueued))
			return nil
		})
	}
	if err := s.View(t.Context(), func(store.Tx) error { return errBoom }); !errors.Is(err, errBoom) {
		t.Errorf("View returned %v, want fn's error", err)
	}
}

// testTxAfterFn: a Tx kept past its fn refuses to be used.
func testTxAfterFn(t *testing.T, s store.Store) {
	var kept store.Tx
	update(t, s, func(tx store.Tx) error {
		kept = tx
		return tx.PutNode(sampleNode("node-a"))
	})
	if _, err := kept.GetNode("node-a"); err == nil {
		t.Error("GetNode on a finished Update's Tx succeeded")
	}
	if err := kept.PutNode(sampleNode("node-b")); err == nil {
		t.Error("PutNode on a finished Update's Tx succeeded")
	}
	view(t, s, func(tx store.Tx) error {
		kept = tx
		_, err := tx.GetNode("node-b")
		wantKind(t, err, failure.ErrNotFound, "node-b")
		return nil
	})
	if _, err := kept.GetNode("node-a"); err == nil {
		t.Error("GetNode on a finished View's Tx succeeded")
	}
}

func testCancelledContext(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	called := false
	err := s.Update(ctx, func(tx store.Tx) error {
		called = true
		return tx.PutNode(sampleNode("node-a"))
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Update with a cancelled context = %v, want context.Canceled", err)
	}
	if called {
		t.Error("Update with a cancelled context ran fn")
	}
	err = s.View(ctx, func(store.Tx) error { called = true; return nil })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("View with a cancelled context = %v, want context.Canceled", err)
	}
	if called {
		t.Error("View with a cancelled context ran fn")
	}
	view(t, s, func(tx store.Tx) error {
		_, err := tx.GetNode("node-a")
		wantKind(t, err, failure.ErrNotFound, "node-a")
		return nil
	})
}

// testConcurrentUpdates: read-modify-write Updates from many goroutines lose
// nothing, which is what serializable means here.
func testConcurrentUpdates(t *testing.T, s store.Store) {
	concurrentIncrements(t, s, s.Update)
}

// testConcurrentLockedUpdates: the same through UpdateLocked, whose promise
// is exactly that a record read by key and written back loses nothing.
// Each increment also reads a second record (a node) by key, and once one
// goroutine reads the two in the other order, so a store that locks rows
// meets a deadlock here (and, on PostgreSQL, the waits queued behind it:
// several seconds, deadlock_timeout being a second), which it must retry.
func testConcurrentLockedUpdates(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error { return tx.PutNode(sampleNode("node-a")) })
	concurrentIncrements(t, s, s.UpdateLocked)
}

func concurrentIncrements(t *testing.T, s store.Store, commit func(context.Context, func(store.Tx) error) error) {
	const goroutines, increments = 8, 50
	update(t, s, func(tx store.Tx) error {
		r := sampleRun("counter", at(0), api.RunRunning)
		r.Retries = 0
		return tx.CreateRun(r)
	})
	ctx := t.Context()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range increments {
				runs := 0
				err := commit(ctx, func(tx store.Tx) error {
					// Reversed on its first run only: a rerun in the
					// same order would deadlock again and again.
					runs++
					reversed := g == 1 && i == 5 && runs == 1
					if reversed { // the node first: the opposite order
						if _, err := tx.GetNode("node-a"); err != nil && !errors.Is(err, failure.ErrNotFound) {
							return err
						}
					}
					r, err := tx.GetRun("counter")
					if err != nil {
						return err
					}
					if !reversed {
						n, err := tx.GetNode("node-a")
						if err == nil {
							n.AgentVersion = fmt.Sprintf("v-%d-%d", g, i)
							err = tx.PutNode(n)
						}
						if err != nil && !errors.Is(err, failure.ErrNotFound) {
							return err
						}
					}
					r.Retries++
					if _, err := tx.SeeEvent("node-a", fmt.Sprintf("%d-%d", g, i), at(0)); err != nil {
						return err
					}
					return tx.PutRun(r)
				})
				if err != nil {
					t.Errorf("goroutine %d, increment %d: %v", g, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	view(t, s, func(tx store.Tx) error {
		if got := must1[store.Run](t)(tx.GetRun("counter")).Retries; got != goroutines*increments {
			t.Errorf("counter = %d after %d increments", got, goroutines*increments)
		}
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		for g := range goroutines {
			if must1[bool](t)(tx.SeeEvent("node-a", fmt.Sprintf("%d-%d", g, increments-1), at(0))) {
				t.Errorf("event of goroutine %d was not recorded", g)
			}
		}
		return nil
	})
}

// testSnapshotViews: Views running beside Updates that move a quantity
// between two runs always see the total unchanged.
func testSnapshotViews(t *testing.T, s store.Store) {
	const total, writers, moves = 1000, 4, 25
	update(t, s, func(tx store.Tx) error {
		a := sampleRun("run-a", at(0), api.RunRunning)
		a.Retries = total
		b := sampleRun("run-b", at(0), api.RunRunning)
		b.Retries = 0
		must(t, tx.CreateRun(a))
		return tx.CreateRun(b)
	})
	ctx := t.Context()
	var writersWG, readersWG sync.WaitGroup
	done := make(chan struct{})
	var mu sync.Mutex
	views := 0
	for range 2 {
		readersWG.Go(func() {
			for {
				err := s.View(ctx, func(tx store.Tx) error {
					a, err := tx.GetRun("run-a")
					if err != nil {
						return err
					}
					runs, err := tx.ListRuns(store.ListRunsOptions{})
					if err != nil {
						return err
					}
					sum := a.Retries
					for _, r := range runs {
						if r.ID == "run-b" {
							sum += r.Retries
						}
					}
					if sum != total {
						return fmt.Errorf("a View saw a total of %d, want %d", sum, total)
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				views++
				mu.Unlock()
				select {
				case <-done:
					return
				default:
				}
			}
		})
	}
	for range writers {
		writersWG.Go(func() {
			for range moves {
				err := s.Update(ctx, func(tx store.Tx) error {
					a, err := tx.GetRun("run-a")
					if err != nil {
						return err
					}
					a.Retries--
					if err := tx.PutRun(a); err != nil {
						return err
					}
					b, err := tx.GetRun("run-b")
					if err != nil {
						return err
					}
					b.Retries++
					return tx.PutRun(b)
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	writersWG.Wait()
	close(done)
	readersWG.Wait()
	if views == 0 {
		t.Error("no View completed")
	}
	view(t, s, func(tx store.Tx) error {
		a := must1[store.Run](t)(tx.GetRun("run-a")).Retries
		b := must1[store.Run](t)(tx.GetRun("run-b")).Retries
		if a != total-writers*moves || b != writers*moves {
			t.Errorf("after the moves: a = %d, b = %d; want %d, %d", a, b, total-writers*moves, writers*moves)
		}
		return nil
	})
}

func (h *harness) testCallsAfterClose(t *testing.T) {
	s, closeNow := h.start(t)
	update(t, s, func(tx store.Tx) error { return tx.PutNode(sampleNode("node-a")) })
	if err := closeNow(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	called := false
	if err := s.Update(t.Context(), func(store.Tx) error { called = true; return nil }); err == nil {
		t.Error("Update after Close succeeded")
	}
	if err := s.View(t.Context(), func(store.Tx) error { called = true; return nil }); err == nil {
		t.Error("View after Close succeeded")
	}
	if called {
		t.Error("fn ran after Close")
	}
}

// testPersistence: everything committed is there after Close and Reopen;
// nothing rolled back is.
func (h *harness) testPersistence(t *testing.T) {
	if h.opts.Reopen == nil {
		t.Skip("the implementation is not durable (Options.Reopen is nil)")
	}
	s, closeNow := h.start(t)
	k := nodeproto.WorkloadKey{RunID: "run-1", Attempt: 1}
	spent := sampleInvitation("inv-1", "node-a")
	spent.SpentAt = ptr(at(time.Minute))
	done := sampleOperation("op-done", "node-a", at(0))
	done.Result = &nodeproto.Result{OperationID: "op-done", Kind: nodeproto.KindLaunchWorkload, Outcome: nodeproto.OutcomeOK, At: at(time.Second)}
	update(t, s, func(tx store.Tx) error {
		must(t, tx.PutNode(sampleNode("node-a")))
		must(t, tx.CreateInvitation(sampleInvitation("inv-1", "node-a")))
		must(t, tx.PutSession(sampleSession("sess-1", "node-a")))
		must(t, tx.CreateRun(sampleRun("run-1", at(0), api.RunRunning, "node-a")))
		must(t, tx.CreateRun(sampleRun("run-2", at(time.Second), api.RunQueued)))
		must(t, tx.PutOperation(sampleOperation("op-1", "node-a", at(0))))
		must(t, tx.PutOperation(done))
		must1[bool](t)(tx.SeeEvent("node-a", "000001", at(0)))
		must1[int64](t)(tx.AppendLog(k, 0, []byte("hello ")))
		must(t, tx.CreateToken(sampleToken("tok-1")))
		must(t, tx.CreateArtifact(sampleArtifact("data", 1)))
		must(t, tx.PutRegistryCredential(sampleRegistryCredential("ghcr.io")))
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		must(t, tx.PutInvitation(spent))
		must1[int64](t)(tx.AppendLog(k, 6, []byte("world")))
		return nil
	})
	_ = s.Update(t.Context(), func(tx store.Tx) error {
		must(t, tx.PutNode(sampleNode("node-rolled-back")))
		return errBoom
	})
	if err := closeNow(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s, _ = manage(t, h.opts.Reopen(t, s))
	update(t, s, func(tx store.Tx) error {
		same(t, "node", must1[store.Node](t)(tx.GetNode("node-a")), sampleNode("node-a"))
		_, err := tx.GetNode("node-rolled-back")
		wantKind(t, err, failure.ErrNotFound, "node-rolled-back")
		same(t, "invitation", must1[store.Invitation](t)(tx.GetInvitation("inv-1")), spent)
		same(t, "session", must1[store.Session](t)(tx.GetSession("sess-1")), sampleSession("sess-1", "node-a"))
		same(t, "run", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunRunning, "node-a"))
		wantIDs(t, "runs", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{}))), []string{"run-2", "run-1"})
		wantIDs(t, "runs on node-a", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: "node-a"}))), []string{"run-1"})
		wantIDs(t, "pending", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-a"))), []string{"op-1"})
		same(t, "operation with result", must1[store.Operation](t)(tx.GetOperation("op-done")), done)
		if must1[bool](t)(tx.SeeEvent("node-a", "000001", at(0))) {
			t.Error("an event seen before Close is fresh after reopening")
		}
		same(t, "token", must1[store.Token](t)(tx.GetToken("tok-1")), sampleToken("tok-1"))
		same(t, "artifact", must1[store.Artifact](t)(tx.GetArtifact("data", "v1")), sampleArtifact("data", 1))
		same(t, "registry credential", must1[store.RegistryCredential](t)(tx.GetRegistryCredential("", "ghcr.io")), sampleRegistryCredential("ghcr.io"))
		data, size, err := tx.ReadLog(k, 0, 100)
		must(t, err)
		if string(data) != "hello world" || size != 11 {
			t.Errorf("log = %q (size %d), want %q", data, size, "hello world")
		}
		if size := must1[int64](t)(tx.AppendLog(k, 0, []byte("hello world!"))); size != 12 {
			t.Errorf("AppendLog after reopening: size %d, want 12", size)
		}
		return nil
	})
}

// testLockNode: LockNode reads the node (ErrNotFound for one not stored,
// an error in a View), and holds it against writers of every kind. Half
// the writers add an operation under the fencing token they read with
// LockNode, in an Update; the other half, in UpdateLocked as an
// enrollment is, raise the token and re-fence every pending operation.
// However they interleave, no operation is left under an old token.
func testLockNode(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error { return tx.PutNode(sampleNode("node-a")) })
	update(t, s, func(tx store.Tx) error {
		if n, err := tx.LockNode("node-a"); err != nil || n.ID != "node-a" {
			t.Errorf("LockNode = %+v, %v", n, err)
		}
		if _, err := tx.LockNode("nobody"); !errors.Is(err, failure.ErrNotFound) {
			t.Errorf("LockNode of a node not stored: %v, want ErrNotFound", err)
		}
		return nil
	})
	err := s.View(t.Context(), func(tx store.Tx) error {
		_, err := tx.LockNode("node-a")
		return err
	})
	if err == nil {
		t.Error("LockNode in a View succeeded")
	}
	const goroutines, rounds = 6, 15
	ctx := t.Context()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range rounds {
				var err error
				if g%2 == 0 {
					err = s.Update(ctx, func(tx store.Tx) error {
						n, err := tx.LockNode("node-a")
						if err != nil {
							return err
						}
						// A pause between the read and the write: without
						// the lock, a re-fencing fits in it.
						time.Sleep(2 * time.Millisecond)
						op := sampleOperation(fmt.Sprintf("op-%d-%d", g, i), "node-a", at(time.Duration(i)*time.Second))
						op.Command.FencingToken = n.FencingToken
						return tx.PutOperation(op)
					})
				} else {
					var stale []string
					err = s.UpdateLocked(ctx, func(tx store.Tx) error {
						stale = nil
						n, err := tx.GetNode("node-a")
						if err != nil {
							return err
						}
						ops, err := tx.PendingOperations("node-a")
						if err != nil {
							return err
						}
						n.FencingToken++
						if err := tx.PutNode(n); err != nil {
							return err
						}
						for _, op := range ops {
							// Every operation was written under the
							// token then current, or re-fenced since.
							if op.Command.FencingToken != n.FencingToken-1 {
								stale = append(stale, fmt.Sprintf("%s at %d", op.ID, op.Command.FencingToken))
							}
							op.Command.FencingToken = n.FencingToken
							if err := tx.PutOperation(op); err != nil {
								return err
							}
						}
						return nil
					})
					if len(stale) > 0 {
						t.Errorf("a re-fencing found operations under an older token than the node's: %v (each written beside a re-fencing it did not wait for)", stale)
					}
				}
				if err != nil {
					t.Errorf("goroutine %d, round %d: %v", g, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	view(t, s, func(tx store.Tx) error {
		fence := must1[store.Node](t)(tx.GetNode("node-a")).FencingToken
		ops := must1[[]store.Operation](t)(tx.PendingOperations("node-a"))
		if len(ops) != goroutines/2*rounds {
			t.Errorf("%d pending operations, want %d", len(ops), goroutines/2*rounds)
		}
		for _, op := range ops {
			if op.Command.FencingToken != fence {
				t.Errorf("operation %s under token %d, the node's is %d: written beside a re-fencing it did not wait for", op.ID, op.Command.FencingToken, fence)
			}
		}
		return nil
	})
}
