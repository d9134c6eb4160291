package console

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane/internal/history"
)

// fakeStats is the replica's series and containers, in memory.
type fakeStats struct {
	fleet []history.FleetPoint
	since time.Time
	lat   map[string][]history.LatencyPoint
	hot   map[string][]client.FnContainers
}

func (s *fakeStats) Fleet() ([]history.FleetPoint, time.Time) { return s.fleet, s.since }
func (s *fakeStats) Latency(id string) []history.LatencyPoint { return s.lat[id] }
func (s *fakeStats) Hot(_ context.Context, ids []string) (map[string][]client.FnContainers, error) {
	out := map[string][]client.FnContainers{}
	for _, id := range ids {
		out[id] = s.hot[id]
	}
	return out, nil
}

func TestRenderChartDrawsLinesGapsAndLonePoints(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	spec := chartSpec{Title: `p50 of <b>"x"</b>`, Unit: "ms", From: t0, To: at(10), Gap: 90 * time.Second,
		Times: []time.Time{at(0), at(1), at(2), at(6), at(9)},
		Lines: []chartLine{{Label: "p50", Values: []float64{10, 20, 30, 40, math.NaN()}}, {Label: "p99", Values: []float64{70, math.NaN(), 5, 5, 5}}}}
	svg := string(renderChart(spec))
	if svg != string(renderChart(spec)) {
		t.Fatal("the same spec drew two charts")
	}
	for _, want := range []string{
		`<svg class="chart" viewBox="0 0 600 160" role="img" aria-label="p50 of &lt;b&gt;&#34;x&#34;&lt;/b&gt;">`,
		// p50: three points joined (a minute apart), then one alone (four
		// minutes on), drawn as a dot; the scale tops at 100 ms.
		`d="M84.0 112.4L134.8 100.8L185.6 89.2M388.8 77.6h0.1"`,
		// p99: a point before a gap (NaN), then three points each more
		// than the 90 s Gap from the one before: four dots.
		`d="M84.0 42.8h0.1M185.6 118.2h0.1M388.8 118.2h0.1M541.2 118.2h0.1"`,
		`>100 ms</text>`, `>10:00Z</text>`, `>10:10Z</text>`, `stroke-dasharray="6 3"`, `>p99</text>`,
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %s:\n%s", want, svg)
		}
	}
	if strings.Contains(svg, "style=") || strings.Contains(svg, "<script") {
		t.Errorf("chart has inline style or script, which the CSP forbids:\n%s", svg)
	}
}

func TestNiceCeil(t *testing.T) {
	for in, want := range map[float64]float64{0: 1, 0.3: 0.5, 1: 1, 1.2: 2, 7: 10, 30: 50, 101: 200, 4500: 5000} {
		if got := niceCeil(in); math.Abs(got-want) > 1e-9 {
			t.Errorf("niceCeil(%v) = %v, want %v", in, got, want)
		}
	}
}

func TestFleetChartOrItsAbsence(t *testing.T) {
	f := newFixture(t, 10)
	stats := &fakeStats{}
	f.con.cfg.Stats = stats
	ck, _ := f.signIn("tok-read")
	if page := body(t, f.do("GET", "/ui/fleet", ck, nil)); !strings.Contains(page, "No GPU history on this replica yet") {
		t.Fatalf("a replica without samples does not say so:\n%s", page)
	}
	stats.since = f.now.Add(-time.Hour)
	for i := range 60 {
		stats.fleet = append(stats.fleet, history.FleetPoint{At: stats.since.Add(time.Duration(i+1) * time.Minute), Busy: i, Idle: 60 - i, Sick: 1})
	}
	if page := body(t, f.do("GET", "/ui/fleet", ck, nil)); !strings.Contains(page, "No queue history here") {
		t.Errorf("a replica that never scheduled does not say it has no queue history:\n%s", page)
	}
	for i := 30; i < 60; i++ { // it scheduled for the last half hour
		stats.fleet[i].Queued, stats.fleet[i].QueueKnown = 100-i, true
	}
	page := body(t, f.do("GET", "/ui/fleet", ck, nil))
	for _, want := range []string{`<svg class="chart"`, "now 59 busy, 1 idle, 1 sick; at most 59 busy", "since 23:00Z",
		`aria-label="Runs waiting in the queue over time"`, "41 at 00:00Z; at most 70."} {
		if !strings.Contains(page, want) {
			t.Errorf("fleet page lacks %q:\n%s", want, page)
		}
	}
}

func TestNodePageGPUsUseHealthAndDrain(t *testing.T) {
	f := newFixture(t, 10)
	facts := api.NodeFactsDoc{
		"accelerators": []any{map[string]any{"uuid": "GPU-a", "model": "H100", "memory_bytes": 80 << 30}, map[string]any{"uuid": "GPU-b", "model": "H100"}},
		"functions":    map[string]any{"containers": []any{map[string]any{"fn_id": "fn-9", "idle": 1, "busy": 1}}},
	}
	f.api.nodes = []api.Node{{ID: "gpu-1", Status: api.NodeReady, Facts: &facts, Draining: true, Cordoned: true, Running: []string{"r-1/1"}, GPUsInUse: []string{"GPU-a"},
		GPUs: []api.NodeGPU{{UUID: "GPU-a", State: api.GPUStateHealthy}, {UUID: "GPU-b", State: api.GPUStateSick, Reason: "xid_79", Detail: "fell off the bus"}}}}
	f.api.runs[0].Attempts = []api.Attempt{{Number: 1, NodeID: "gpu-1", GPUs: []string{"GPU-a"}, Status: api.AttemptRunning,
		GPUUsage: []api.GPUUsage{{UUID: "GPU-a", UtilLast: 87, UtilAvg: 60, MemoryLastMiB: 4096, PowerLastW: -1}}}}
	ck, _ := f.signIn("tok-read")
	page := body(t, f.do("GET", "/ui/nodes/gpu-1", ck, nil))
	for _, want := range []string{"draining: 1 runs and 2 function containers left", "<td>87% <small>(avg 60%)</small></td><td>4096 MiB</td><td>—</td>",
		`busy by <a href="/ui/runs/r-1">r-1/1</a>`, "sick: xid_79<br><small>fell off the bus</small>", "80.0 GiB"} {
		if !strings.Contains(page, want) {
			t.Errorf("node page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, `id="drain"`) {
		t.Errorf("a reader sees a Drain button")
	}
	fleet := body(t, f.do("GET", "/ui/fleet", ck, nil))
	if !strings.Contains(fleet, `<a href="/ui/nodes/gpu-1">gpu-1</a>`) || !strings.Contains(fleet, "draining: 1 runs and 2 function containers left") || !strings.Contains(fleet, ": idle, sick (xid_79)") {
		t.Errorf("fleet row lacks the node link, drain progress or GPU health:\n%s", fleet)
	}
	f.api.nodes[0].Running, f.api.nodes[0].Facts = nil, nil
	if page := body(t, f.do("GET", "/ui/nodes/gpu-1", ck, nil)); !strings.Contains(page, "drained: nothing left on it") {
		t.Errorf("a drained node does not say it is done:\n%s", page)
	}
}

func TestFunctionPageHotContainersAndLatency(t *testing.T) {
	f := newFixture(t, 10)
	stats := &fakeStats{hot: map[string][]client.FnContainers{"fn-9": {{NodeID: "n-1", Idle: 2}, {NodeID: "n-2", Busy: 3, Idle: 1}}},
		lat: map[string][]history.LatencyPoint{"fn-9": {{At: f.now.Add(-time.Minute), Calls: 40, P50: 3 * time.Millisecond, P99: 90 * time.Millisecond}}}}
	f.con.cfg.Stats = stats
	ck, _ := f.signIn("tok-read")
	page := body(t, f.do("GET", "/ui/functions/fn-9", ck, nil))
	for _, want := range []string{"3 busy, 3 idle, 0 starting on 2 nodes", `<li><a href="/ui/nodes/n-2">n-2</a>: 3 busy, 1 idle, 0 starting</li><li><a href="/ui/nodes/n-1">`,
		`<svg class="chart"`, "40 calls through this replica", "p50 3ms, p99 90ms"} {
		if !strings.Contains(page, want) {
			t.Errorf("function page lacks %q:\n%s", want, page)
		}
	}
	stats.lat = nil
	if page := body(t, f.do("GET", "/ui/functions/fn-9", ck, nil)); !strings.Contains(page, "No latency history") {
		t.Errorf("a function without history does not say so")
	}
}

func TestHotListBounded(t *testing.T) {
	var rows []client.FnContainers
	for i := range 30 {
		rows = append(rows, client.FnContainers{NodeID: string(rune('a' + i)), Busy: i % 3})
	}
	v := hotOf(rows, 10)
	if len(v.Nodes) != 10 || v.More != 20 || v.Held != 30 || v.Busy != 30 || v.Nodes[0].Busy != 2 {
		t.Fatalf("hot view %+v", v)
	}
}

func TestStatusEventsCarryTheAttemptsTable(t *testing.T) {
	f := newFixture(t, 10)
	exit := 3
	placed := time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC)
	f.api.runs[0].Attempts = []api.Attempt{{Number: 1, NodeID: "n-1", GPUs: []string{"GPU-a"}, Status: api.AttemptFailed, PlacedAt: placed, ExitCode: &exit, StopReason: "exited"}}
	ck, _ := f.signIn("tok-read")
	got := body(t, f.do("GET", "/ui/runs/r-1/log", ck, nil))
	want := `"attempts":[["1","n-1","GPU-a","failed","2026-01-01 00:00:01Z","—","—","3","exited"]]`
	if !strings.Contains(got, want) {
		t.Fatalf("status event lacks the attempts table %s:\n%s", want, got)
	}
	page := body(t, f.do("GET", "/ui/runs/r-1", ck, nil))
	if !strings.Contains(page, `<tbody id="attempt-rows">`+"\n"+`<tr><th scope="row">1</th><td>n-1</td><td>GPU-a</td><td>failed</td><td>2026-01-01 00:00:01Z</td>`) {
		t.Fatalf("the page's attempts table is not the event's:\n%s", page)
	}
}
