package controlplane

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/nodeproto"
)

// TestConsoleHistorySamples: calls through the replica become a point of
// their function's latency series (counted from the latency histogram as
// Prometheus keeps it), and the fleet's GPUs a point of the fleet's.
func TestConsoleHistorySamples(t *testing.T) {
	f := newFnFixture(t)
	n := f.startNode("n1", echo)
	_, fn := f.deploy("charts", api.Fn{Name: "echo"})
	for range 3 {
		if status, _, body := f.do("POST", "/invoke/"+fn.ID, "ping", "Content-Type", "text/plain"); status != 201 {
			t.Fatalf("call: %d %s", status, body)
		}
	}
	f.srv.sampleHistory(context.Background())
	pts := f.srv.history.LatencyPoints(fn.ID)
	if len(pts) != 1 || pts[0].Calls != 3 || pts[0].P50 <= 0 || pts[0].P99 < pts[0].P50 {
		t.Fatalf("latency series after 3 calls: %+v", pts)
	}
	f.srv.sampleHistory(context.Background()) // no calls since: no point
	if got := f.srv.history.LatencyPoints(fn.ID); len(got) != 1 {
		t.Fatalf("a period without calls added a point: %+v", got)
	}
	// The node reports its containers with its facts: the console's hot
	// containers are those, from the nodes' copy.
	facts := nodeproto.NodeFacts{CapabilityVersion: nodeproto.Version, CPUs: 4, MemoryBytes: 8 << 30,
		Functions: &nodeproto.FunctionCapacity{MemoryBytes: 2 << 30, MilliCPUs: 1000, Containers: []nodeproto.FunctionContainers{{FnID: fn.ID, Idle: 2, Busy: 1}}}}
	if _, err := f.tr.SendEvents(context.Background(), "n1", n.tok, []nodeproto.Event{{ID: "facts-2", Kind: nodeproto.EventFacts, At: time.Now(), Facts: &facts}}); err != nil {
		t.Fatal(err)
	}
	hot, err := consoleStats{f.srv}.Hot(context.Background(), []string{fn.ID, "other"})
	if err != nil || len(hot) != 1 || len(hot[fn.ID]) != 1 || hot[fn.ID][0] != (client.FnContainers{NodeID: "n1", Idle: 2, Busy: 1}) {
		t.Fatalf("hot containers: %+v, %v", hot, err)
	}
	if fleet := f.srv.history.FleetPoints(); len(fleet) != 2 || !fleet[1].QueueKnown {
		t.Fatalf("fleet series: %+v, want a point a sample, with the queue's depth (a single replica schedules)", fleet)
	}
}

// TestConsoleHistoryCountsHeldGPUs: the fleet series counts a GPU held by
// a placed run as busy and the node's other as idle, from the replica's
// copies, as the Fleet page's summary (read from the store) counts them.
func TestConsoleHistoryCountsHeldGPUs(t *testing.T) {
	f := newRunsFixture(t)
	g := f.enrollFactsNode("g1")
	g.report(t, nodeproto.NodeFacts{CPUs: 64, MemoryBytes: 512 << 30, Accelerators: []nodeproto.Accelerator{h100(uuidA), h100(uuidB)}})
	spec := specAt(0, "reg/app:1")
	spec.GPUs = 1
	if run := f.submitAndReconcile(spec); run.Status != api.RunPlaced {
		t.Fatalf("1-GPU run: %s, %q", run.Status, run.Reason)
	}
	f.srv.sampleHistory(context.Background())
	pts := f.srv.history.FleetPoints()
	if len(pts) != 1 || pts[0].Busy != 1 || pts[0].Idle != 1 {
		t.Fatalf("fleet series: %+v, want a point with 1 GPU busy and 1 idle", pts)
	}
	var page api.NodeList
	f.want(http.StatusOK, &page, "GET", "/v1/nodes?limit=1", nil)
	if page.Summary == nil || page.Summary.GPUs["busy"] != pts[0].Busy || page.Summary.GPUs["idle"] != pts[0].Idle {
		t.Fatalf("the Fleet page's summary %+v disagrees with the series' point %+v", page.Summary, pts[0])
	}
}
