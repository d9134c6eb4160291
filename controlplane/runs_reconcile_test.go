package controlplane

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/store"
)

// TestRunWaitsForAnAgentThatSpeaksItsCommands: a run whose launch mounts
// an Artifact is not placed on a node whose agent is older than
// nodeproto.VersionArtifacts (nodeproto.RequiredVersion): no command reaches
// that node, and the run waits with a reason that says so. Once the agent
// speaks the version, the run is placed with its prepare_artifact.
func TestRunWaitsForAnAgentThatSpeaksItsCommands(t *testing.T) {
	f := newRunsFixture(t)
	ctx := context.Background()
	now := time.Now()
	f.putNode("old", 64<<30, 1)
	digest := strings.Repeat("ab", 32)
	if err := f.srv.update(ctx, func(tx store.Tx) error {
		return tx.CreateArtifact(store.Artifact{Seq: 1, ArtifactVersion: api.ArtifactVersion{Name: "data", Version: "v1", SHA256: digest,
			Size: 3, Format: api.ArtifactFile, CreatedAt: now}})
	}); err != nil {
		t.Fatal(err)
	}
	spec := specAt(0, "reg/app:1")
	spec.Artifacts = []api.ArtifactMount{{Name: "data", MountPath: "/data"}}
	var run api.Run
	f.want(http.StatusCreated, &run, "POST", "/v1/runs", spec)

	pending := func() []store.Operation {
		t.Helper()
		var ops []store.Operation
		if err := f.srv.store.View(ctx, func(tx store.Tx) error {
			var err error
			ops, err = tx.PendingOperations("old")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ops
	}
	if err := f.srv.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	f.want(http.StatusOK, &run, "GET", "/v1/runs/"+run.ID, nil)
	if run.Status != api.RunQueued || !strings.Contains(run.Reason, "agent too old") || !strings.Contains(run.Reason, "need capability version 2") {
		t.Fatalf("run on an agent too old for Artifacts: status %s, reason %q", run.Status, run.Reason)
	}
	if ops := pending(); len(ops) != 0 {
		t.Fatalf("an agent too old for Artifacts was sent %d commands: %+v", len(ops), ops)
	}

	f.putNode("old", 64<<30, nodeproto.Version)
	if err := f.srv.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	f.want(http.StatusOK, &run, "GET", "/v1/runs/"+run.ID, nil)
	if run.Status != api.RunPlaced {
		t.Fatalf("run after the agent's upgrade: status %s, reason %q", run.Status, run.Reason)
	}
	kinds := map[string]int{}
	for _, op := range pending() {
		kinds[op.Command.Kind]++
		if need := nodeproto.RequiredVersion(op.Command); need > nodeproto.Version {
			t.Errorf("%s needs version %d", op.Command.Kind, need)
		}
	}
	if kinds[nodeproto.KindPrepareArtifact] != 1 || kinds[nodeproto.KindLaunchWorkload] != 1 {
		t.Errorf("commands after the upgrade = %v, want one prepare_artifact and one launch", kinds)
	}
}

// TestPlacementsOfAReplicaThatNoLongerLeadsAreRefused: a replica whose
// belief that it leads outlived the fact (another started an epoch since,
// store.Lead) commits no placement: its pass fails as fenced and the run
// stays queued; the replica that leads now places it, once.
func TestPlacementsOfAReplicaThatNoLongerLeadsAreRefused(t *testing.T) {
	f := newRunsFixture(t)
	ctx := context.Background()
	f.addNodes(1)
	stale := New(Config{Lease: time.Minute}, f.st, pinResolver{}, nil)
	if !stale.startEpoch(ctx) || !f.srv.startEpoch(ctx) {
		t.Fatal("could not start the epochs")
	}
	var run api.Run
	f.want(http.StatusCreated, &run, "POST", "/v1/runs", specAt(0, "reg/app:1"))
	if err := stale.reconcile(ctx); !errors.Is(err, failure.ErrFenced) {
		t.Fatalf("the stale leader's pass = %v, want ErrFenced", err)
	}
	f.want(http.StatusOK, &run, "GET", "/v1/runs/"+run.ID, nil)
	if run.Status != api.RunQueued || len(run.Attempts) != 0 {
		t.Fatalf("after the stale leader's pass the run is %s with %d attempts, want queued with none", run.Status, len(run.Attempts))
	}
	if err := f.srv.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	f.want(http.StatusOK, &run, "GET", "/v1/runs/"+run.ID, nil)
	if run.Status != api.RunPlaced || len(run.Attempts) != 1 {
		t.Fatalf("after the leader's pass the run is %s with %d attempts, want placed once", run.Status, len(run.Attempts))
	}
}

// TestIdlePassLeavesTheNodesCopyAlone: a reconcile pass with nothing
// queued and the nodes judged within the liveness flush period does not
// read the copy of the nodes' records, so a fleet enrolling onto an empty
// queue does not have every pass copy every node to take in the records
// it just wrote (schedcopy.Copy.Nodes). A pass that will place, or whose
// judgement is due, takes them in, and places on the node just written.
func TestIdlePassLeavesTheNodesCopyAlone(t *testing.T) {
	f := newRunsFixture(t)
	ctx := context.Background()
	f.putNode("small", 512<<20, nodeproto.Version) // too little memory for the run below
	if err := f.srv.reconcile(ctx); err != nil {   // the first pass judges
		t.Fatal(err)
	}
	if n := f.srv.sched.Patched(); n != 0 {
		t.Fatalf("after the first pass %d node records are not taken in, want 0", n)
	}

	f.putNode("big", 64<<30, nodeproto.Version)
	if err := f.srv.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.srv.sched.Patched(); n != 1 {
		t.Fatalf("an idle pass within the flush period took in the node records (%d left, want 1)", n)
	}

	var run api.Run
	f.want(http.StatusCreated, &run, "POST", "/v1/runs", specAt(0, "reg/app:1"))
	if err := f.srv.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.srv.sched.Patched(); n != 0 {
		t.Fatalf("a placing pass left %d node records out, want 0", n)
	}
	f.want(http.StatusOK, &run, "GET", "/v1/runs/"+run.ID, nil)
	if run.Status != api.RunPlaced || len(run.Attempts) != 1 || run.Attempts[0].NodeID != "big" {
		t.Fatalf("run after the placing pass: status %s, attempts %+v (reason %q), want placed on big", run.Status, run.Attempts, run.Reason)
	}

	f.putNode("later", 64<<30, nodeproto.Version)
	f.srv.schedView.at = time.Now().Add(-time.Hour) // the judgement is due
	if err := f.srv.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.srv.sched.Patched(); n != 0 {
		t.Fatalf("a pass whose judgement was due left %d node records out, want 0", n)
	}
}
