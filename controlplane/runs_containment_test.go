package controlplane

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// TestRunAskingContainmentWaitsForAnAgentThatAppliesIt: a run that asks for
// a user, a read-only root, no network and a process limit is stored with
// them, is not sent to an agent older than nodeproto.VersionHardening
// (which would ignore the fields and run the container without them), and
// once the node's agent speaks it, its launch carries all four; a spec
// asking for the host's network is refused at submit.
func TestRunAskingContainmentWaitsForAnAgentThatAppliesIt(t *testing.T) {
	f := newRunsFixture(t)
	ctx := context.Background()
	f.putNode("n", 64<<30, nodeproto.VersionHardening-1)
	spec := specAt(0, "reg/app:1")
	spec.User, spec.ReadOnlyRootfs, spec.Network, spec.PidsLimit = "1000:1000", true, api.NetworkNone, 9000
	var run api.Run
	f.want(http.StatusCreated, &run, "POST", "/v1/runs", spec)
	if run.User != "1000:1000" || !run.ReadOnlyRootfs || run.Network != api.NetworkNone || run.PidsLimit != 9000 {
		t.Fatalf("stored run = %+v, want the containment asked for", run.RunSpec)
	}
	if err := f.srv.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	f.want(http.StatusOK, &run, "GET", "/v1/runs/"+run.ID, nil)
	if run.Status != api.RunQueued || !strings.Contains(run.Reason, "need capability version 5") {
		t.Fatalf("run on an agent too old for containment: status %s, reason %q", run.Status, run.Reason)
	}

	f.putNode("n", 64<<30, nodeproto.Version)
	if err := f.srv.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	var ops []store.Operation
	if err := f.srv.store.View(ctx, func(tx store.Tx) error {
		var err error
		ops, err = tx.PendingOperations("n")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var launch *nodeproto.LaunchWorkloadCommand
	for _, op := range ops {
		if op.Command.Kind == nodeproto.KindLaunchWorkload {
			launch = op.Command.LaunchWorkload
		}
	}
	if launch == nil || launch.User != "1000:1000" || !launch.ReadOnlyRootfs || launch.Network != nodeproto.NetworkNone || launch.PidsLimit != 9000 {
		t.Fatalf("launch after the upgrade = %+v, want the run's containment", launch)
	}

	spec.Network = "host"
	f.want(http.StatusBadRequest, nil, "POST", "/v1/runs", spec)
}

// TestRunNeedingANewerAgentGoesWhereOneRuns: in a fleet part way through
// an upgrade, a run whose launch needs nodeproto.VersionHardening is
// placed on a node whose agent speaks it, even when an older node has
// more room (and ranks first), instead of waiting for the older one's
// upgrade; a run that needs nothing new still goes to the roomier node.
func TestRunNeedingANewerAgentGoesWhereOneRuns(t *testing.T) {
	f := newRunsFixture(t)
	ctx := context.Background()
	f.putNode("a-old", 256<<30, nodeproto.VersionHardening-1)
	f.putNode("b-new", 16<<30, nodeproto.VersionHardening)
	contained := specAt(0, "reg/app:1")
	contained.ReadOnlyRootfs = true
	var runs [2]api.Run
	f.want(http.StatusCreated, &runs[0], "POST", "/v1/runs", contained)
	f.want(http.StatusCreated, &runs[1], "POST", "/v1/runs", specAt(1, "reg/app:1"))
	if err := f.srv.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"b-new", "a-old"} {
		var got api.Run
		f.want(http.StatusOK, &got, "GET", "/v1/runs/"+runs[i].ID, nil)
		if got.Status != api.RunPlaced || len(got.Attempts) != 1 || got.Attempts[0].NodeID != want {
			t.Errorf("run %d: status %s (%s), attempts %+v; want placed on %s", i, got.Status, got.Reason, got.Attempts, want)
		}
	}
}
