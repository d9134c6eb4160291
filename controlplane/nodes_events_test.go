package controlplane

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// readCounter counts the reads and event checks write transactions make,
// single-record and batch forms apart.
type readCounter struct {
	store.Store
	mu     sync.Mutex
	counts map[string]int
}

func (c *readCounter) add(what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[what]++
}

func (c *readCounter) Update(ctx context.Context, fn func(store.Tx) error) error {
	return c.Store.Update(ctx, func(tx store.Tx) error { return fn(&countedTx{Tx: tx, c: c}) })
}

func (c *readCounter) UpdateLocked(ctx context.Context, fn func(store.Tx) error) error {
	return c.Store.UpdateLocked(ctx, func(tx store.Tx) error { return fn(&countedTx{Tx: tx, c: c}) })
}

type countedTx struct {
	store.Tx
	c *readCounter
}

func (t *countedTx) GetRun(id string) (store.Run, error) { t.c.add("GetRun"); return t.Tx.GetRun(id) }
func (t *countedTx) GetRuns(ids []string) ([]store.Run, error) {
	t.c.add("GetRuns")
	return t.Tx.GetRuns(ids)
}
func (t *countedTx) GetOperation(id string) (store.Operation, error) {
	t.c.add("GetOperation")
	return t.Tx.GetOperation(id)
}
func (t *countedTx) GetOperations(ids []string) ([]store.Operation, error) {
	t.c.add("GetOperations")
	return t.Tx.GetOperations(ids)
}
func (t *countedTx) SeeEvent(n, id string, at time.Time) (bool, error) {
	t.c.add("SeeEvent")
	return t.Tx.SeeEvent(n, id, at)
}
func (t *countedTx) SeeEvents(n string, ids []string, at time.Time) ([]bool, error) {
	t.c.add("SeeEvents")
	return t.Tx.SeeEvents(n, ids, at)
}
func (t *countedTx) SeeEventBatches(batches []store.EventCheck) ([][]bool, error) {
	t.c.add("SeeEventBatches")
	return t.Tx.SeeEventBatches(batches)
}
func (t *countedTx) PutRun(r store.Run) error       { t.c.add("PutRun"); return t.Tx.PutRun(r) }
func (t *countedTx) PutRuns(runs []store.Run) error { t.c.add("PutRuns"); return t.Tx.PutRuns(runs) }

// TestEventBatchReadsInBatches: a node's batch of events about several runs
// and a failed launch costs one check of its events, one read of its runs
// and one of its operations, and one write of the runs, whatever its size
// (on PostgreSQL a statement each, where a read per event was a round trip
// per event), and applies every event as before.
func TestEventBatchReadsInBatches(t *testing.T) {
	f := newProtoFixture(t)
	counter := &readCounter{Store: f.st, counts: map[string]int{}}
	f.srv.store = counter
	e := f.enroll(t, "n1", f.invite(t, "n1"))
	ctx := context.Background()
	now := f.clock.Now()
	running := func(id string) store.Run {
		return store.Run{Run: api.Run{ID: id, Status: api.RunRunning, CreatedAt: now, RunSpec: api.RunSpec{Retries: 5},
			Attempts: []api.Attempt{{Number: 1, NodeID: "n1", Status: api.AttemptRunning, PlacedAt: now}}}}
	}
	launch := store.Operation{ID: "op-launch", NodeID: "n1", CreatedAt: now, Command: nodeproto.Command{OperationID: "op-launch",
		Kind: nodeproto.KindLaunchWorkload}}
	if err := f.st.Update(ctx, func(tx store.Tx) error {
		for _, id := range []string{"r1", "r2", "r3"} {
			if err := tx.CreateRun(running(id)); err != nil {
				return err
			}
		}
		return tx.PutOperation(launch)
	}); err != nil {
		t.Fatal(err)
	}
	code := 0
	exited := func(id, run string) nodeproto.Event {
		return nodeproto.Event{ID: id, Kind: nodeproto.EventWorkload, Workload: &nodeproto.WorkloadObservation{
			WorkloadKey: nodeproto.WorkloadKey{RunID: run, Attempt: 1}, Phase: nodeproto.PhaseExited, ExitCode: &code, StartedAt: &now, FinishedAt: &now}}
	}
	failed := nodeproto.Event{ID: "inc-0000000000000004", Kind: nodeproto.EventResult, Result: &nodeproto.Result{
		OperationID: "op-launch", Kind: nodeproto.KindLaunchWorkload, Outcome: nodeproto.OutcomeFailed, At: now, Error: "no such image", Workload: &nodeproto.WorkloadKey{RunID: "r3", Attempt: 1}}}
	batch := []nodeproto.Event{exited("inc-0000000000000001", "r1"), exited("inc-0000000000000002", "r2"),
		exited("inc-0000000000000001", "r1"), failed, exited("inc-0000000000000005", "gone")}
	acked, err := f.tr.SendEvents(ctx, "n1", e.SessionToken, batch)
	if err != nil || len(acked) != len(batch) {
		t.Fatalf("SendEvents = %v, %v; want all %d acknowledged", acked, err, len(batch))
	}
	counter.mu.Lock()
	got := counter.counts
	counter.mu.Unlock()
	// "gone" is no run of ours: the batch read finds it missing, and
	// applying it asks once more (GetRun), which is the only single read.
	want := map[string]int{"SeeEventBatches": 1, "GetRuns": 1, "GetOperations": 1, "PutRuns": 1, "GetRun": 1}
	for what, n := range want {
		if got[what] != n {
			t.Errorf("%s called %d times, want %d (all: %v)", what, got[what], n, got)
		}
	}
	for _, single := range []string{"SeeEvent", "GetOperation", "PutRun"} {
		if got[single] != 0 {
			t.Errorf("%s called %d times in a batch, want none (all: %v)", single, got[single], got)
		}
	}
	if err := f.st.View(ctx, func(tx store.Tx) error {
		for id, status := range map[string]string{"r1": api.RunSucceeded, "r2": api.RunSucceeded, "r3": api.RunQueued} {
			r, err := tx.GetRun(id)
			if err != nil {
				return err
			}
			if r.Status != status {
				t.Errorf("run %s is %s after the batch, want %s", id, r.Status, status)
			}
		}
		op, err := tx.GetOperation("op-launch")
		if err == nil && op.Result == nil {
			t.Error("the launch's result was not stored")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// TestEventBatchesOfAGroupReadTogether: the batches of several nodes
// committed in one transaction (shareEvents, the group commit's Share)
// check their events, read all their runs and write them back in one
// batch each, and each batch is applied as if alone.
func TestEventBatchesOfAGroupReadTogether(t *testing.T) {
	f := newProtoFixture(t)
	counter := &readCounter{Store: f.st, counts: map[string]int{}}
	ctx := context.Background()
	now := f.clock.Now()
	code := 0
	var needs []any
	if err := f.st.Update(ctx, func(tx store.Tx) error {
		for _, node := range []string{"n1", "n2", "n3"} {
			run := store.Run{Run: api.Run{ID: "run-" + node, Status: api.RunRunning, CreatedAt: now,
				Attempts: []api.Attempt{{Number: 1, NodeID: node, Status: api.AttemptRunning, PlacedAt: now}}}}
			if err := tx.CreateRun(run); err != nil {
				return err
			}
			need, err := newEventNeed(node, []nodeproto.Event{{ID: "inc-0000000000000001", Kind: nodeproto.EventWorkload,
				Workload: &nodeproto.WorkloadObservation{WorkloadKey: nodeproto.WorkloadKey{RunID: run.ID, Attempt: 1},
					Phase: nodeproto.PhaseExited, ExitCode: &code, StartedAt: &now, FinishedAt: &now}}}, now)
			if err != nil {
				return err
			}
			needs = append(needs, need)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := counter.UpdateLocked(ctx, func(tx store.Tx) error {
		shared, finish, err := shareEvents(tx, needs)
		if err != nil {
			return err
		}
		for _, v := range needs {
			need := v.(*eventNeed)
			if !need.fresh[0] {
				t.Errorf("node %s's event was not fresh", need.nodeID)
			}
			if _, _, err := f.srv.reports().Event(shared, need.nodeID, need.events[0], nil); err != nil {
				return err
			}
		}
		return finish()
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"SeeEventBatches": 1, "SeeEvents": 0, "GetRuns": 1, "PutRuns": 1, "GetRun": 0, "PutRun": 0}
	for what, n := range want {
		if counter.counts[what] != n {
			t.Errorf("%s called %d times for 3 nodes' batches, want %d (all: %v)", what, counter.counts[what], n, counter.counts)
		}
	}
	if err := f.st.View(ctx, func(tx store.Tx) error {
		for _, node := range []string{"n1", "n2", "n3"} {
			if r, err := tx.GetRun("run-" + node); err != nil || r.Status != api.RunSucceeded {
				t.Errorf("run-%s: %s, %v; want succeeded", node, r.Status, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
