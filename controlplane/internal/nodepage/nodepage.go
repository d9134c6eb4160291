// Package nodepage picks one page of the fleet's nodes and counts the
// whole fleet beside it, for GET /v1/nodes?limit=N (the web console's
// Fleet page): building the API's view of 100 nodes rather than of every
// node is what keeps a page of a 10,000-node fleet cheap. Pure: package
// controlplane reads the nodes and their work and passes them in. Only
// package controlplane may import it.
package nodepage

import (
	"cmp"
	"net/url"
	"slices"
	"strconv"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// Options is a page's request: at most Limit nodes with IDs after After,
// of Status ("" any; "cordoned" the cordoned and draining).
type Options struct {
	Limit  int
	After  string
	Status string
}

// Parse reads limit, after and status; ok is false when limit is absent
// (the whole list, as before pages existed).
func Parse(q url.Values) (o Options, ok bool, err error) {
	v := q.Get("limit")
	if v == "" {
		return Options{}, false, nil
	}
	o.Limit, err = strconv.Atoi(v)
	if err != nil || o.Limit < 1 || o.Limit > api.MaxNodePage {
		return o, false, failure.Invalid("limit", "must be an integer from 1 to %d, got %q", api.MaxNodePage, v)
	}
	o.After, o.Status = q.Get("after"), q.Get("status")
	switch o.Status {
	case "", api.NodeReady, api.NodeUnreachable, api.NodeInvited, "cordoned":
	default:
		return o, false, failure.Invalid("status", "unknown node status %q; use ready, unreachable, invited or cordoned", o.Status)
	}
	return o, true, nil
}

// Page returns the page o asks for, in ID order, the next page's After
// ("" after the last), and the whole fleet counted. status is a node's
// status as the API states it; busy is the GPUs a node's active attempts
// hold. nodes is not modified.
func Page(nodes []store.Node, o Options, status func(store.Node) string, busy func(nodeID string) []string) (page []store.Node, next string, sum api.FleetSummary) {
	sum = api.FleetSummary{Nodes: map[string]int{}, GPUs: map[string]int{}}
	sorted := slices.SortedFunc(slices.Values(nodes), func(a, b store.Node) int { return cmp.Compare(a.ID, b.ID) })
	for _, n := range sorted {
		st := status(n)
		cordoned := n.Cordoned || n.Draining
		sum.Nodes[st]++
		if cordoned {
			sum.Nodes["cordoned"]++
		}
		countGPUs(n, busy(n.ID), sum.GPUs)
		if o.Status != "" && o.Status != st && !(o.Status == "cordoned" && cordoned) {
			continue
		}
		sum.Matching++
		if n.ID > o.After && len(page) <= o.Limit {
			page = append(page, n)
		}
	}
	if len(page) > o.Limit {
		page = page[:o.Limit]
		next = page[len(page)-1].ID
	}
	return page, next, sum
}

// countGPUs adds a node's GPUs to counts: flagged (a flag withholds it:
// disputed, sick or cordoned) before busy, busy before idle.
func countGPUs(n store.Node, busy []string, counts map[string]int) {
	if n.Facts == nil {
		return
	}
	for _, a := range n.Facts.Accelerators {
		switch {
		case slices.ContainsFunc(n.Flags, func(f api.NodeFlag) bool { return f.GPU == a.UUID && f.WithholdsGPU() }):
			counts["flagged"]++
		case slices.Contains(busy, a.UUID):
			counts["busy"]++
		default:
			counts["idle"]++
		}
	}
}
