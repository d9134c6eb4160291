// Package fngauge is the control plane's gauge of function containers
// (mercator_fn_containers), summed over the ready nodes' last facts. Only
// package controlplane/function uses it; it is apart to keep that package
// within its size.
package fngauge

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mercator/mercator/store"
)

// Containers is the gauge of function containers by function and state
// (idle, paused, busy, starting), summed over the ready nodes' last facts.
// It is summed at each scrape from the nodes' records as last read (Nodes,
// never a read per scrape): nodes report it with their facts, and a scrape
// is rare next to calls.
type Containers struct {
	// Nodes is the nodes' records as last read (never a read per
	// scrape), and Ready whether a node counts.
	Nodes func(context.Context) ([]store.Node, error)
	Ready func(store.Node) bool
}

var containersDesc = prometheus.NewDesc("mercator_fn_containers",
	"Function containers on ready nodes by function and state (idle, paused, busy, starting), as the nodes last reported.",
	[]string{"fn", "state"}, nil)

func (c *Containers) Describe(ch chan<- *prometheus.Desc) { ch <- containersDesc }

func (c *Containers) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type key struct{ fn, state string }
	sums := map[key]int{}
	// The scheduler's copy of the nodes' records, not a read of every
	// record per scrape: at ten thousand nodes that read was a tenth of a
	// second of the control plane's CPU.
	nodes, _ := c.Nodes(ctx)
	for _, n := range nodes {
		if !c.Ready(n) || n.Facts == nil || n.Facts.Functions == nil {
			continue
		}
		for _, fc := range n.Facts.Functions.Containers {
			sums[key{fc.FnID, "idle"}] += fc.Idle - fc.Paused
			sums[key{fc.FnID, "paused"}] += fc.Paused
			sums[key{fc.FnID, "busy"}] += fc.Busy
			sums[key{fc.FnID, "starting"}] += fc.Starting
		}
	}
	for k, v := range sums {
		ch <- prometheus.MustNewConstMetric(containersDesc, prometheus.GaugeValue, float64(v), k.fn, k.state)
	}
}
