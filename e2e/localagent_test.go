package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/daemon"
)

// TestServerLocalAgent: `mercator server --local-agent NODE`
// (daemon.ServerOptions.LocalAgent) runs the node agent in the server's
// own process, enrolled by the server with no invitation handed to
// anyone. A Run and a function call go through it on real Docker;
// `mercator node rm` stops it and `mercator node invite` brings it back,
// enrolled by the server again. It reports that it cannot upgrade itself.
func TestServerLocalAgent(t *testing.T) {
	node := uniqueNodeID(t, "local")
	c := startClusterWith(t, 10*time.Second, func(o *daemon.ServerOptions) {
		o.LocalAgent = &daemon.AgentOptions{NodeID: node, StateDir: filepath.Join(o.DataDir, "agent"), Heartbeat: time.Second}
	})
	t.Cleanup(func() { removeContainers(t, []string{node}) })
	ready := func() bool {
		n, err := c.client.GetNode(c.ctx, node)
		return err == nil && n.Status == "ready" && n.Facts != nil
	}
	c.waitFor("the local node ready", ready)
	fence := func() uint64 {
		n, err := c.client.GetNode(c.ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		return n.FencingToken
	}
	first := fence()
	if n, _ := c.client.GetNode(c.ctx, node); n.Facts == nil || (*n.Facts)["no_self_upgrade"] != true {
		t.Errorf("the local agent does not say it cannot upgrade itself: facts %v", n.Facts)
	}

	run := c.wait(c.submit(api.RunSpec{Command: []string{"lines", "2"}}).ID)
	if run.Status != api.RunSucceeded || run.Attempts[0].NodeID != node {
		t.Fatalf("run = %s on %+v: %s", run.Status, run.Attempts, run.Reason)
	}
	_, fn := c.deployHello("localagent", api.Fn{Image: c.publish("fn-fdk")})
	if status, body := c.invoke(fn.ID, `{"name":"local"}`); status != 200 || !strings.Contains(body, `"calls":1`) {
		t.Fatalf("invoke: %d %q", status, body)
	}

	// Removed: the agent is fenced out and stays stopped.
	if _, err := c.client.RemoveNode(c.ctx, node); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the removed node not ready", func() bool { return !ready() })
	// Past the server's first look at it (localAgentRetry, 5 s) the node
	// is still removed: no enrollment undid the operator's removal.
	time.Sleep(7 * time.Second)
	if n, err := c.client.GetNode(c.ctx, node); err != nil || n.FencingToken != first+1 || n.Status == "ready" {
		t.Fatalf("the removed node after 7 s: %+v, %v", n, err)
	}
	// Brought back by an invitation nobody spends but the server.
	if _, err := c.client.InviteNode(c.ctx, node, 0); err != nil {
		t.Fatal(err)
	}
	// Removal raised the fencing token once; the new enrollment raises it
	// again.
	c.waitFor("the local node enrolled again", func() bool { return fence() >= first+2 && ready() })
	if status, _ := c.invoke(fn.ID, `{"name":"again"}`); status != 200 {
		t.Fatalf("invoke after the node came back: %d", status)
	}
}
