package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/nodeproto"
)

// Node facts checked before they are believed (docs/hardening.md, "Node
// facts"), against the real control plane over real HTTP: nodes that are
// the node protocol with fabricated facts, beside a real agent.

// protoNode is a node that speaks the node protocol with made-up facts:
// it enrolls with a real invitation, keeps itself alive with heartbeats,
// holds a session stream open and records every command it is sent.
type protoNode struct {
	id    string
	tr    *nodeagent.HTTPTransport
	token string
	seq   int
	mu    sync.Mutex
	cmds  []nodeproto.Command
}

func (c *cluster) startProtoNode(base string) *protoNode {
	c.t.Helper()
	id := uniqueNodeID(c.t, base)
	inv, err := c.client.InviteNode(c.ctx, id, 0)
	if err != nil {
		c.t.Fatalf("invite %s: %v", id, err)
	}
	n := &protoNode{id: id, tr: nodeagent.NewHTTPTransport(c.url, nil)}
	e, err := n.tr.Enroll(c.ctx, nodeproto.EnrollmentRequest{NodeID: id, Invitation: inv.Token, AgentVersion: "fabricated", CapabilityVersion: nodeproto.Version})
	if err != nil {
		c.t.Fatalf("enroll %s: %v", id, err)
	}
	n.token = e.SessionToken
	ctx, cancel := context.WithCancel(c.ctx)
	c.t.Cleanup(cancel)
	cmds := make(chan nodeproto.Command)
	c.wg.Add(3)
	go func() { // the session stream, reopened if it ends
		defer c.wg.Done()
		for ctx.Err() == nil {
			if err := n.tr.Session(ctx, id, n.token, cmds); err != nil {
				select { // an agent backs off before it reopens; so does this
				case <-time.After(100 * time.Millisecond):
				case <-ctx.Done():
				}
			}
		}
	}()
	go func() {
		defer c.wg.Done()
		for {
			select {
			case cmd := <-cmds:
				n.mu.Lock()
				n.cmds = append(n.cmds, cmd)
				n.mu.Unlock()
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { // heartbeats keep it inside its lease, as an agent's do
		defer c.wg.Done()
		t := time.NewTicker(c.lease / 10)
		defer t.Stop()
		for {
			_, _ = n.tr.SendEvents(ctx, id, n.token, nil)
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return n
}

func (n *protoNode) report(t *testing.T, facts nodeproto.NodeFacts) {
	t.Helper()
	n.seq++
	facts.AgentVersion, facts.CapabilityVersion = "fabricated", nodeproto.Version
	ev := nodeproto.Event{ID: fmt.Sprintf("facts-%d", n.seq), Kind: nodeproto.EventFacts, At: time.Now().UTC(), Facts: &facts}
	if acked, err := n.tr.SendEvents(context.Background(), n.id, n.token, []nodeproto.Event{ev}); err != nil || len(acked) != 1 {
		t.Fatalf("node %s facts: acked %v, %v", n.id, acked, err)
	}
}

func (n *protoNode) commands() []nodeproto.Command {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]nodeproto.Command(nil), n.cmds...)
}

func fabricatedH100(uuid string) nodeproto.Accelerator {
	return nodeproto.Accelerator{Vendor: "nvidia", Model: "NVIDIA H100 80GB HBM3", UUID: uuid, MemoryBytes: 81559 << 20}
}

// factFlags reads mercator_node_fact_flags_total for kind.
func (c *cluster) factFlags(kind string) string {
	c.t.Helper()
	if v := metricSeries(c.t, c.url, c.token, `mercator_node_fact_flags_total{kind="`+kind+`"}`); v != "" {
		return v
	}
	return "absent"
}

// TestLyingNodeGetsNoRun: a node claiming 100,000 CPUs, 1 PiB of memory and
// 64 H100s once received every Run. Now its report is refused and flagged
// (node get, the metric), the Runs go to the real agent beside it, a GPU
// run waits rather than go to GPUs nobody vouched for, and the liar is
// sent no command at all.
func TestLyingNodeGetsNoRun(t *testing.T) {
	c := startCluster(t)
	honest := c.startAgent("honest")
	liar := c.startProtoNode("liar")
	gpus := make([]nodeproto.Accelerator, 64)
	for i := range gpus {
		gpus[i] = fabricatedH100(fmt.Sprintf("GPU-%08x-0000-1111-2222-333344445555", i))
	}
	liar.report(t, nodeproto.NodeFacts{Hostname: "liar", OS: "linux", Arch: "amd64", CPUs: 100000, MemoryBytes: 1 << 50, Accelerators: gpus})

	out := c.mercator("node", "get", liar.id)
	for _, want := range []string{"Status:", "ready", "Flags:", "facts_refused", "cpus: 100000 is above the maximum of 4096", "memory_bytes: 1125899906842624 is above"} {
		if !strings.Contains(out, want) {
			t.Errorf("node get %s lacks %q:\n%s", liar.id, want, out)
		}
	}
	if got := c.factFlags(api.NodeFlagFactsRefused); got != "1" {
		t.Errorf("mercator_node_fact_flags_total{kind=facts_refused} = %s, want 1", got)
	}
	for i := range 3 {
		done := c.wait(c.submit(api.RunSpec{Command: []string{"lines", "1"}, CPU: 0.5, MemoryBytes: 64 << 20}).ID)
		if done.Status != api.RunSucceeded || done.Attempts[0].NodeID != honest {
			t.Fatalf("run %d: %s on %+v, want succeeded on %s", i, done.Status, done.Attempts, honest)
		}
	}
	gpuRun := c.submit(api.RunSpec{Command: []string{"lines", "1"}, GPUs: 1})
	c.waitFor("the GPU run's waiting reason", func() bool {
		r, err := c.client.GetRun(c.ctx, gpuRun.ID)
		return err == nil && strings.Contains(r.Reason, "1 node has facts the control plane refused")
	})
	if cmds := liar.commands(); len(cmds) != 0 {
		t.Fatalf("the lying node was sent %d commands: %+v", len(cmds), cmds)
	}
	if _, err := c.client.CancelRun(c.ctx, gpuRun.ID); err != nil {
		t.Fatal(err)
	}
}

// TestDuplicateGPUUUIDs: two nodes naming one GPU UUID (once this put a run
// on ["GPU-dup"×4]). Neither gets work on it, node get shows the dispute,
// and `mercator node gpu-clear` on the node whose claim stands gives it
// back to that node alone.
func TestDuplicateGPUUUIDs(t *testing.T) {
	c := startCluster(t)
	a, b := c.startProtoNode("gpu-a"), c.startProtoNode("gpu-b")
	const own, other, dup = "GPU-0000000a-0000-1111-2222-333344445555", "GPU-0000000b-0000-1111-2222-333344445555", "GPU-000000dd-0000-1111-2222-333344445555"
	a.report(t, nodeproto.NodeFacts{Hostname: "a", CPUs: 64, MemoryBytes: 512 << 30,
		Accelerators: []nodeproto.Accelerator{fabricatedH100(own), fabricatedH100(dup), fabricatedH100(dup), fabricatedH100(dup), fabricatedH100(dup)}})
	b.report(t, nodeproto.NodeFacts{Hostname: "b", CPUs: 64, MemoryBytes: 512 << 30, Accelerators: []nodeproto.Accelerator{fabricatedH100(other), fabricatedH100(dup)}})

	for _, n := range []*protoNode{a, b} {
		out := c.mercator("node", "get", n.id)
		if !strings.Contains(out, "gpu_disputed "+dup) || !strings.Contains(out, "also claimed by node") {
			t.Errorf("node get %s lacks the dispute over %s:\n%s", n.id, dup, out)
		}
	}
	if out := c.mercator("node", "get", a.id); !strings.Contains(out, "gpu_duplicate "+dup) || strings.Count(out, dup+"\n") != 1 {
		t.Errorf("node get %s: want %s listed once and flagged as repeated:\n%s", a.id, dup, out)
	}
	run := c.submit(api.RunSpec{Command: []string{"lines", "1"}, GPUs: 2})
	c.waitFor("the 2-GPU run's waiting reason", func() bool {
		r, err := c.client.GetRun(c.ctx, run.ID)
		return err == nil && strings.Contains(r.Reason, "2 nodes have fewer than 2 matching GPUs")
	})
	if n := len(a.commands()) + len(b.commands()); n != 0 {
		t.Fatalf("%d commands sent while the GPU is disputed", n)
	}

	out := c.mercator("node", "gpu-clear", a.id, dup)
	if !strings.Contains(out, "cleared") {
		t.Fatalf("gpu-clear: %s", out)
	}
	if _, errOut, code := c.mercatorExit("", "node", "gpu-clear", a.id, dup); code == 0 || !strings.Contains(errOut, "has no dispute over GPU") {
		t.Fatalf("a second gpu-clear: exit %d, %s", code, errOut)
	}
	var launch *nodeproto.LaunchWorkloadCommand
	c.waitFor("the launch on "+a.id, func() bool {
		for _, cmd := range a.commands() {
			if cmd.Kind == nodeproto.KindLaunchWorkload {
				launch = cmd.LaunchWorkload
				return true
			}
		}
		return false
	})
	if launch.RunID != run.ID || strings.Join(launch.GPUs, ",") != own+","+dup {
		t.Fatalf("launch %+v, want run %s on %s and %s", launch, run.ID, own, dup)
	}
	if n := len(b.commands()); n != 0 {
		t.Fatalf("b, whose dispute stands, was sent %d commands", n)
	}
	if out := c.mercator("node", "get", b.id); !strings.Contains(out, "gpu_disputed "+dup) {
		t.Fatalf("b's dispute must stay until it is cleared there:\n%s", out)
	}
	if _, err := c.client.CancelRun(c.ctx, run.ID); err != nil {
		t.Fatal(err)
	}
}
