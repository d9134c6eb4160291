package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"

	"github.com/mercator/mercator/api"
)

// TestGangOnHostNetwork: a gang of 2 × 8 GPUs asking for the host's network
// (what NCCL between machines needs) starts both members with the host's
// network, as the daemon holds their containers (NetworkMode "host"), and
// with consistent rank variables as each printed them; a single run asking
// for the host's network is refused by the control plane, saying that only
// a gang's members may.
func TestGangOnHostNetwork(t *testing.T) {
	requireGPUHook(t)
	c := startCluster(t)

	single := gpuRun(8, "true")
	single.Network = api.NetworkHost
	single.Image = c.workload
	if _, err := c.client.SubmitRun(c.ctx, single); err == nil || !strings.Contains(err.Error(), "only a gang's members") {
		t.Fatalf("a single run on the host's network: %v, want it refused saying only a gang's members may", err)
	}

	c.startSwitchableAgent(t, "hosta", newSwitchableMachine(t, gpuMachine, ""))
	c.startSwitchableAgent(t, "hostb", newSwitchableMachine(t, gpuMachine, "0"))
	spec := gpuRun(8, append([]string{"env-sleep", "300"}, gangVars...)...)
	spec.Nodes, spec.Network = 2, api.NetworkHost
	submitted := time.Now()
	run := c.submit(spec)
	var r api.Run
	c.waitFor("both members on the host's network running", func() bool {
		var err error
		r, err = c.client.GetRun(c.ctx, run.ID)
		return err == nil && runningSet(r, 1, 2)
	})
	started := time.Since(submitted)

	dc, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	members := gangSet(r, 1)
	if members[0].NodeID == members[1].NodeID || !disjoint(members[0].GPUs, members[1].GPUs) {
		t.Fatalf("members %+v: want two nodes, disjoint GPUs", members)
	}
	master := c.hostnameOf(members[0].NodeID)
	for _, m := range members {
		info, err := dc.ContainerInspect(context.Background(), m.ContainerID)
		if err != nil {
			t.Fatalf("inspect rank %d's container: %v", m.Rank, err)
		}
		if mode := string(info.HostConfig.NetworkMode); mode != "host" {
			t.Fatalf("rank %d's container has network mode %q, want host", m.Rank, mode)
		}
		c.checkRankVars(t, run.ID, m, master)
	}
	t.Logf("gang of 2×8 GPUs on the host's network: both members running %s after it was submitted",
		started.Round(time.Millisecond))

	if _, err := c.client.CancelRun(c.ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	if done := c.wait(run.ID); done.Status != api.RunCancelled {
		t.Fatalf("cancelled gang: %s (%s)", done.Status, done.Reason)
	}
}
