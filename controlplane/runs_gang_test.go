package controlplane

import (
	"context"
	"net/http"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// TestGangCommitsWholeAttemptSet: a gang on the host's network waits
// while its nodes' agents are older than nodeproto.VersionGang (nothing is
// sent); once they speak it, one pass commits the whole attempt set, one
// launch per member with its rank variables; `logs?rank=` refuses a rank
// the gang has not; cancelling stops every member on its own node.
func TestGangCommitsWholeAttemptSet(t *testing.T) {
	f := newRunsFixture(t)
	f.putNode("a", 64<<30, nodeproto.VersionGang-1)
	f.putNode("b", 64<<30, nodeproto.VersionGang-1)
	spec := specAt(0, "reg/app:1")
	spec.CPU, spec.Nodes, spec.Network = 12, 2, api.NetworkHost
	run := f.submitAndReconcile(spec)
	if run.Status != api.RunQueued || len(run.Attempts) != 0 || len(f.pendingOps("a"))+len(f.pendingOps("b")) != 0 {
		t.Fatalf("a host-network gang on agents older than VersionGang: %s %q, %d attempts", run.Status, run.Reason, len(run.Attempts))
	}
	t.Logf("on old agents the gang waits: %s", run.Reason)

	f.putNode("a", 64<<30, nodeproto.VersionGang)
	f.putNode("b", 64<<30, nodeproto.VersionGang)
	if err := f.srv.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.want(http.StatusOK, &run, "GET", "/v1/runs/"+run.ID, nil)
	if run.Status != api.RunPlaced || len(run.Attempts) != 2 {
		t.Fatalf("gang after its agents were upgraded: %s %q, attempts %+v", run.Status, run.Reason, run.Attempts)
	}
	master := run.Attempts[0].NodeID
	for i, a := range run.Attempts {
		if a.Set != 1 || a.Rank != i || a.Number != i+1 {
			t.Fatalf("attempt %d = %+v, want set 1 rank %d", i, a, i)
		}
		ops := f.pendingOps(a.NodeID)
		if len(ops) != 1 || ops[0].Command.LaunchWorkload == nil {
			t.Fatalf("node %s holds %d operations, want rank %d's launch", a.NodeID, len(ops), i)
		}
		l := ops[0].Command.LaunchWorkload
		if l.Attempt != a.Number || l.GangSize != 2 || l.Network != api.NetworkHost || l.Env["RANK"] != []string{"0", "1"}[i] ||
			l.Env["WORLD_SIZE"] != "2" || l.Env["MASTER_ADDR"] != master || l.Env["MASTER_PORT"] != "29500" || l.Env["MERCATOR_RUN_INDEX"] != "0" {
			t.Errorf("rank %d's launch = %+v", i, l)
		}
	}
	f.refusedAs(http.StatusBadRequest, "rank", "ranks are 0 to 1", "GET", "/v1/runs/"+run.ID+"/logs?rank=2", nil)

	f.want(http.StatusOK, &run, "POST", "/v1/runs/"+run.ID+"/cancel", nil)
	for _, a := range run.Attempts {
		stops := 0
		for _, op := range f.pendingOps(a.NodeID) {
			if s := op.Command.StopWorkload; s != nil && s.Attempt == a.Number && s.Reason == "cancelled" {
				stops++
			}
		}
		if stops != 1 || !a.StopRequested {
			t.Errorf("member %d on %s: %d stops issued (stop requested %v), want 1", a.Rank, a.NodeID, stops, a.StopRequested)
		}
	}
	var stored store.Run
	if err := f.srv.store.View(context.Background(), func(tx store.Tx) (err error) { stored, err = tx.GetRun(run.ID); return err }); err != nil || !stored.Cancel {
		t.Fatalf("stored run %+v: %v", stored.Run, err)
	}
}
