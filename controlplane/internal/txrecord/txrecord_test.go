package txrecord

import (
	"context"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// countingTx counts the run writes that reach the store.
type countingTx struct {
	store.Tx
	puts int
}

func (c *countingTx) PutRuns(runs []store.Run) error { c.puts += len(runs); return c.Tx.PutRuns(runs) }
func (c *countingTx) PutRun(r store.Run) error       { c.puts++; return c.Tx.PutRun(r) }

func TestTxRecordsWritesAndMemoWritesOnce(t *testing.T) {
	st := memstore.New()
	ctx := context.Background()
	now := time.Now()
	run := store.Run{Run: api.Run{ID: "r1", Status: api.RunQueued, CreatedAt: now, UpdatedAt: now,
		RunSpec: api.RunSpec{Image: "reg/a@sha256:0a"}, PinnedImage: "reg/a@sha256:0a", Attempts: []api.Attempt{}}}
	var rec *Tx
	err := st.Update(ctx, func(tx store.Tx) error {
		rec = New(tx)
		if err := rec.CreateRun(run); err != nil {
			return err
		}
		second := run
		second.ID = "r2"
		if err := rec.CreateRuns([]store.Run{second}); err != nil {
			return err
		}
		op := store.Operation{ID: "op-1", NodeID: "n1", CreatedAt: now, Command: nodeproto.Command{OperationID: "op-1", Kind: nodeproto.KindKeepAlive}}
		if err := rec.PutOperations([]store.Operation{op}); err != nil {
			return err
		}
		return rec.PutNode(store.Node{ID: "n1", CreatedAt: now})
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Runs) != 2 || len(rec.Nodes) != 1 || len(rec.Cmds["n1"]) != 1 {
		t.Fatalf("recorded runs %d (want 2: one created alone, one in a batch), nodes %d, commands for n1 %d; want 1 each", len(rec.Runs), len(rec.Nodes), len(rec.Cmds["n1"]))
	}
	counting := &countingTx{}
	err = st.Update(ctx, func(tx store.Tx) error {
		counting.Tx = tx
		m := NewMemo(counting)
		for _, status := range []string{api.RunPlaced, api.RunRunning} {
			r, err := m.GetRun("r1")
			if err != nil {
				return err
			}
			r.Status = status
			if err := m.PutRun(r); err != nil {
				return err
			}
		}
		if got, err := m.GetRuns([]string{"r1", "missing"}); err != nil || len(got) != 1 || got[0].Status != api.RunRunning {
			t.Errorf("GetRuns through the memo = %v, %v; want r1 as last written", got, err)
		}
		return m.Flush()
	})
	if err != nil {
		t.Fatal(err)
	}
	if counting.puts != 1 {
		t.Errorf("two writes of one run through the memo reached the store %d times, want once", counting.puts)
	}
	_ = st.View(ctx, func(tx store.Tx) error {
		if r, err := tx.GetRun("r1"); err != nil || r.Status != api.RunRunning {
			t.Errorf("stored run = %s, %v; want running", r.Status, err)
		}
		return nil
	})
}
