package console

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane/internal/history"
)

// Stats is what the replica keeps beside the API for the pages: the
// series the charts draw (package history, in this replica's memory) and
// the function containers the nodes last reported. The pages show only
// what the API let the credential see (a function's series and containers
// only on the page of a function the API returned).
type Stats interface {
	// Fleet is the fleet's GPUs over time and when this replica began
	// sampling (zero: not yet).
	Fleet() (pts []history.FleetPoint, since time.Time)
	// Latency is function fnID's calls over time through this replica.
	Latency(fnID string) []history.LatencyPoint
	// Hot is, for each of fnIDs, its containers on each ready node as the
	// nodes last reported them, by node ID.
	Hot(ctx context.Context, fnIDs []string) (map[string][]client.FnContainers, error)
}

// chartView is a chart with its caption: the figures in words.
type chartView struct {
	SVG     any // template.HTML
	Caption string
}

// fleetChart is the GPUs busy, idle and sick over the window, or nil
// when this replica has no samples yet.
func fleetChart(now time.Time, pts []history.FleetPoint, since time.Time) *chartView {
	if len(pts) == 0 {
		return nil
	}
	spec := chartSpec{Title: "GPUs busy, idle and sick over time", Unit: "GPUs", From: now.Add(-history.Window), To: now, Gap: history.Period * 3 / 2,
		Lines: []chartLine{{Label: "busy"}, {Label: "idle"}, {Label: "sick"}}}
	most := 0
	for _, p := range pts {
		spec.Times = append(spec.Times, p.At)
		for i, v := range []int{p.Busy, p.Idle, p.Sick} {
			spec.Lines[i].Values = append(spec.Lines[i].Values, float64(v))
		}
		most = max(most, p.Busy)
	}
	last := pts[len(pts)-1]
	return &chartView{SVG: renderChart(spec), Caption: fmt.Sprintf(
		"GPUs over the last %s, one sample a %s, as this replica counted them since %s: now %d busy, %d idle, %d sick; at most %d busy.",
		span(history.Window), span(history.Period), since.UTC().Format("15:04Z"), last.Busy, last.Idle, last.Sick, most)}
}

// queueChart is the runs waiting over the window, from the samples taken
// while this replica scheduled, or nil when there is none.
func queueChart(now time.Time, pts []history.FleetPoint) *chartView {
	spec := chartSpec{Title: "Runs waiting in the queue over time", Unit: "runs", From: now.Add(-history.Window), To: now, Gap: history.Period * 3 / 2,
		Lines: []chartLine{{Label: "queued"}}}
	known, most := 0, 0
	var last history.FleetPoint
	for _, p := range pts {
		if !p.QueueKnown {
			continue
		}
		spec.Times = append(spec.Times, p.At)
		spec.Lines[0].Values = append(spec.Lines[0].Values, float64(p.Queued))
		known, most, last = known+1, max(most, p.Queued), p
	}
	if known == 0 {
		return nil
	}
	return &chartView{SVG: renderChart(spec), Caption: fmt.Sprintf(
		"Runs waiting as the scheduler's passes left them, one sample a %s while this replica scheduled: %d at %s; at most %d.",
		span(history.Period), last.Queued, last.At.UTC().Format("15:04Z"), most)}
}

// latencyChart is a function's p50 and p99 latency over the window, or
// nil when no call of it went through this replica in the window.
func latencyChart(now time.Time, name string, pts []history.LatencyPoint) *chartView {
	if len(pts) == 0 {
		return nil
	}
	spec := chartSpec{Title: "Latency of " + name + " over time (p50 and p99)", Unit: "ms", From: now.Add(-history.Window), To: now, Gap: history.Period * 3 / 2,
		Lines: []chartLine{{Label: "p50"}, {Label: "p99"}}}
	var calls uint64
	worst := time.Duration(0)
	for _, p := range pts {
		spec.Times = append(spec.Times, p.At)
		spec.Lines[0].Values = append(spec.Lines[0].Values, ms(p.P50))
		spec.Lines[1].Values = append(spec.Lines[1].Values, ms(p.P99))
		calls += p.Calls
		worst = max(worst, p.P99)
	}
	last := pts[len(pts)-1]
	return &chartView{SVG: renderChart(spec), Caption: fmt.Sprintf(
		"%d calls through this replica in the last %s, one point a %s with calls; the last (%s): p50 %s, p99 %s; worst p99 %s. Estimated from the latency histogram's buckets, as Prometheus' histogram_quantile does (within a factor of two).",
		calls, span(history.Window), span(history.Period), last.At.UTC().Format("15:04Z"), last.P50, last.P99, worst)}
}

// span says a window or period in words: "6 hours", "minute", "30 s".
func span(d time.Duration) string {
	switch {
	case d == time.Minute:
		return "minute"
	case d%time.Hour == 0:
		return fmt.Sprintf("%d hours", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%d minutes", d/time.Minute)
	}
	return d.String()
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)) / 1000 }

// hotView is a function's containers on the nodes: the per-node rows (the
// busiest first, at most limit of them) and the totals over every node.
type hotView struct {
	Nodes                                []client.FnContainers
	More                                 int // nodes not listed
	Idle, Busy, Starting, Prepared, Held int // Held: nodes with any
}

func hotOf(rows []client.FnContainers, limit int) hotView {
	rows = slices.Clone(rows)
	slices.SortFunc(rows, func(a, b client.FnContainers) int {
		return cmp.Or(cmp.Compare(b.Busy+b.Idle+b.Starting, a.Busy+a.Idle+a.Starting), cmp.Compare(a.NodeID, b.NodeID))
	})
	var v hotView
	for _, r := range rows {
		v.Idle, v.Busy, v.Starting, v.Prepared = v.Idle+r.Idle, v.Busy+r.Busy, v.Starting+r.Starting, v.Prepared+r.Prepared
	}
	v.Held = len(rows)
	if len(rows) > limit {
		v.More, rows = len(rows)-limit, rows[:limit]
	}
	v.Nodes = rows
	return v
}
