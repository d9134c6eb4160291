package controlplane

import (
	"fmt"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
)

// maxTries is how many nodes one call is offered to: "up to four nodes
// are tried; the last queues the call" (docs/functions.md, Placement).
const maxTries = 4

// TestInvokeSpillCapAndLastNodeQueues: a call is offered to at most
// maxTries nodes of the function's order, each but the last told not to
// wait (NoWait: a busy node answers at once and the call moves on); the
// last one tried is told to queue the call, so a call on a busy fleet
// waits on one node instead of failing or touring every node. A function
// with one node queues there at once.
func TestInvokeSpillCapAndLastNodeQueues(t *testing.T) {
	f := newFnFixture(t)
	// Every node is busy: it refuses a call it may refuse, and queues (here:
	// answers) one it was told to wait for.
	handle := func(n *fakeNode, inv nodeproto.InvokeCommand) {
		if inv.NoWait {
			n.fail(inv, "busy", "full")
			return
		}
		echo(n, inv)
	}
	var ids []string
	var shares []scheduler.FunctionNode
	nodes := map[string]*fakeNode{}
	for i := 0; i < maxTries+2; i++ {
		id := fmt.Sprintf("n%d", i)
		ids, nodes[id] = append(ids, id), f.startNode(id, handle)
		shares = append(shares, scheduler.FunctionNode{ID: id, Share: nodeproto.FunctionCapacity{MemoryBytes: 1 << 30}})
	}
	_, fn := f.deploy("app", api.Fn{Name: "f"})
	order := scheduler.PlaceFunction(fn.ID, shares, scheduler.FunctionNeed{MemoryBytes: 128 << 20})
	if len(order) != len(ids) {
		t.Fatalf("placement = %v, want every node", order)
	}
	status, h, body := f.do("POST", "/invoke/"+fn.ID, "queued")
	last := order[maxTries-1].ID
	if status != 201 || h.Get("X-Node") != last || h.Get("X-Nowait") != "false" || string(body) != "queued" {
		t.Fatalf("call on a busy fleet = %d %q %v; want it queued on %s, the %dth of the order", status, body, h, last, maxTries)
	}
	for i, n := range order {
		want := int64(0)
		if i < maxTries {
			want = 1
		}
		if got := nodes[n.ID].got.Load(); got != want {
			t.Errorf("node %s (%d in the order) was offered the call %d times, want %d", n.ID, i+1, got, want)
		}
	}

	// One node: it is both first and last, so it queues the call.
	g := newFnFixture(t)
	g.startNode("only", handle)
	_, one := g.deploy("app", api.Fn{Name: "f"})
	if status, h, _ := g.do("POST", "/invoke/"+one.ID, "x"); status != 201 || h.Get("X-Nowait") != "false" {
		t.Fatalf("call with one node = %d %v; want it queued there", status, h)
	}
}
