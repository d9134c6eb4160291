package nodeagent

import (
	"context"
	"fmt"
	"testing"

	"github.com/docker/docker/api/types/container"

	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/fnagent"
)

// TestObserveIgnoresFunctionContainers: function containers share the
// node label with Runs' but are not workloads; Observe never reports them
// (they carry fnagent.LabelFn and no LabelRun), so the control plane never
// sees an attempt that is not one.
func TestObserveIgnoresFunctionContainers(t *testing.T) {
	run := fakeContainer("run-c", capability.WorkloadKey{RunID: "r1", Attempt: 1}, "n1", container.StateRunning)
	fn := fakeContainer("fn-c", capability.WorkloadKey{}, "n1", container.StateRunning)
	fn.Config.Labels = map[string]string{fnagent.LabelFn: "fn-1", fnagent.LabelApp: "app-1", fnagent.LabelNode: "n1", fnagent.LabelPool: "p"}
	obs, err := newDockerRuntime(observeFake(run, fn), WithNodeLabel("n1")).Observe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(obs) != 1 || obs[0].RunID != "r1" {
		t.Fatalf("observations = %+v, want the run's alone", obs)
	}
}

// TestFirstDelivery: a rendezvous is served once, however many sessions
// carry it, and the memory of served ones stays bounded.
func TestFirstDelivery(t *testing.T) {
	f := &agentFunctions{seen: map[string]bool{}}
	if !f.firstDelivery("rv-1") || f.firstDelivery("rv-1") {
		t.Fatal("rv-1 served twice or never")
	}
	for i := 0; i < 3*recentDeliveries; i++ {
		f.firstDelivery(fmt.Sprintf("rv-x%d", i))
	}
	if len(f.seen)+len(f.seenBefore) > 2*recentDeliveries {
		t.Errorf("%d rendezvous remembered", len(f.seen)+len(f.seenBefore))
	}
	if f.firstDelivery(fmt.Sprintf("rv-x%d", 3*recentDeliveries-1)) {
		t.Error("a recent rendezvous was served again")
	}
}
