package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
)

func TestCordonAndDrain(t *testing.T) {
	c := startClusterWithLease(t, 4*time.Second)
	n := c.startAgent("n")
	if _, err := c.client.CordonNode(c.ctx, n); err != nil {
		t.Fatal(err)
	}
	run := c.submit(api.RunSpec{Command: []string{"sleep", "300"}})
	c.waitFor("a reason naming the cordon", func() bool {
		r, _ := c.client.GetRun(c.ctx, run.ID)
		return r.Status == api.RunQueued && strings.Contains(r.Reason, "1 node is cordoned")
	})
	if _, err := c.client.UncordonNode(c.ctx, n); err != nil {
		t.Fatal(err)
	}
	c.waitFor("running after uncordon", func() bool {
		r, _ := c.client.GetRun(c.ctx, run.ID)
		return r.Status == api.RunRunning
	})
	node, err := c.client.DrainNode(c.ctx, n, time.Second)
	if err != nil || !node.Draining || node.DrainDeadline == nil {
		t.Fatalf("drain: %v %+v", err, node)
	}
	other := c.submit(api.RunSpec{Command: []string{"echo"}})
	done := c.wait(run.ID)
	if done.Status != api.RunFailed || done.Attempts[0].StopReason != "drained" {
		t.Fatalf("drained run: %s %+v", done.Status, done.Attempts[0])
	}
	if r, _ := c.client.GetRun(c.ctx, other.ID); r.Status != api.RunQueued || !strings.Contains(r.Reason, "1 node is draining") {
		t.Fatalf("run submitted during the drain: %s %q", r.Status, r.Reason)
	}
	if _, err := c.client.CancelRun(c.ctx, other.ID); err != nil {
		t.Fatal(err)
	}
}
