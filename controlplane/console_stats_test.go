package controlplane

import (
	"context"
	"testing"

	"github.com/mercator/mercator/api"
)

// TestConsoleHistorySamples: calls through the replica become a point of
// their function's latency series (counted from the latency histogram as
// Prometheus keeps it), and the fleet's GPUs a point of the fleet's.
func TestConsoleHistorySamples(t *testing.T) {
	f := newFnFixture(t)
	f.startNode("n1", echo)
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
	if fleet := f.srv.history.FleetPoints(); len(fleet) != 2 || !fleet[1].QueueKnown {
		t.Fatalf("fleet series: %+v, want a point a sample, with the queue's depth (a single replica schedules)", fleet)
	}
}
