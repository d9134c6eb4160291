package e2e

import (
	"slices"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
)

// fnCreated lists the IDs of a function's containers that are created and
// not started: prepared ones (fnagent/prepare.go).
func fnCreated(t testing.TB, fnID string) []string {
	out, err := execOutput("docker", "ps", "-a", "-q", "--no-trunc", "--filter", "status=created", "--filter", "label=mercator.fn="+fnID)
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	return strings.Fields(out)
}

// fnAll lists every container of a function, whatever its state.
func fnAll(t testing.TB, fnID string) []string {
	out, err := execOutput("docker", "ps", "-a", "-q", "--filter", "label=mercator.fn="+fnID)
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	return strings.Fields(out)
}

// TestFunctionSpares: a function without a minimum keeps a prepared
// container on its node once its first call's container is up (fn get
// counts it, and shows the node holding the image); after a scale to zero
// the next cold call starts that very container; deleting the function
// removes every container of it, prepared or idle. (That the spare
// outlives the deploy's hold is fnagent's TestSpareWithoutHold, on the
// daemon: the hold lasts 30 s, longer than this test should.)
func TestFunctionSpares(t *testing.T) {
	c := startCluster(t)
	node := c.startAgent("spares")
	_, fn := c.deployHello("spares", api.Fn{IdleTimeout: 1})
	if status, body := c.invoke(fn.ID, `{"name":"one"}`); status != 200 {
		t.Fatalf("first call = %d %q", status, body)
	}
	c.waitFor("the node reports a prepared container", func() bool {
		hot, err := c.client.FunctionContainers(c.ctx, fn.ID)
		return err == nil && len(hot) == 1 && hot[0].Prepared == 1
	})
	c.waitFor("the node reports holding the image", func() bool {
		nodes, err := c.client.NodesHoldingImage(c.ctx, fn.Image)
		return err == nil && slices.Contains(nodes, node)
	})
	out := c.mercator("fn", "get", "spares", "hello")
	if !strings.Contains(out, "1 prepared") || !strings.Contains(out, "Image held on:") || !strings.Contains(out, node) {
		t.Errorf("fn get shows no prepared container or image on %s:\n%s", node, out)
	}
	c.waitFor("scale to zero after the idle timeout", func() bool { return len(fnContainers(t, fn.ID)) == 0 })
	prepared := fnCreated(t, fn.ID)
	if len(prepared) != 1 {
		t.Fatalf("prepared containers after the scale to zero: %v; want one", prepared)
	}
	if status, body := c.invoke(fn.ID, `{"name":"two"}`); status != 200 {
		t.Fatalf("call after the scale to zero = %d %q", status, body)
	}
	if state, err := execOutput("docker", "inspect", "--format", "{{.State.Status}}", prepared[0]); err != nil || strings.TrimSpace(state) != "running" {
		t.Errorf("the prepared container after the cold call: %q, %v; want it started (running)", state, err)
	}
	c.waitFor("the next spare prepared", func() bool { return len(fnCreated(t, fn.ID)) == 1 })
	if err := c.client.DeleteFn(c.ctx, fn.ID); err != nil {
		t.Fatal(err)
	}
	c.waitFor("no container of the deleted function left", func() bool { return len(fnAll(t, fn.ID)) == 0 })
}
