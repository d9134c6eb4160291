package fngauge

import (
	"context"
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// TestContainersSumsReadyNodes: the gauge sums each function's containers
// by state over the nodes that count (ready), idle net of paused, and
// skips nodes without facts or without functions.
func TestContainersSumsReadyNodes(t *testing.T) {
	node := func(id string, cs ...nodeproto.FunctionContainers) store.Node {
		n := store.Node{}
		n.ID = id
		n.Facts = &nodeproto.NodeFacts{Functions: &nodeproto.FunctionCapacity{Containers: cs}}
		return n
	}
	nodes := []store.Node{
		node("a", nodeproto.FunctionContainers{FnID: "f1", Idle: 3, Paused: 1, Busy: 2, Starting: 1}),
		node("b", nodeproto.FunctionContainers{FnID: "f1", Idle: 1, Busy: 1}, nodeproto.FunctionContainers{FnID: "f2", Busy: 4}),
		node("down", nodeproto.FunctionContainers{FnID: "f1", Busy: 100}),
		{},
	}
	nodes[3].ID = "no-facts"
	g := &Containers{
		Nodes: func(context.Context) ([]store.Node, error) { return nodes, nil },
		Ready: func(n store.Node) bool { return n.ID != "down" },
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(g)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += " " + l.GetName() + "=" + l.GetValue()
			}
			got[key] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"mercator_fn_containers fn=f1 state=busy": 3, "mercator_fn_containers fn=f1 state=idle": 3,
		"mercator_fn_containers fn=f1 state=paused": 1, "mercator_fn_containers fn=f1 state=starting": 1,
		"mercator_fn_containers fn=f2 state=busy": 4, "mercator_fn_containers fn=f2 state=idle": 0,
		"mercator_fn_containers fn=f2 state=paused": 0, "mercator_fn_containers fn=f2 state=starting": 0,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("gauge %v; want %v", got, want)
	}
}
