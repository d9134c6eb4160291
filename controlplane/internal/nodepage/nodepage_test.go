package nodepage

import (
	"fmt"
	"net/url"
	"reflect"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

func fleet() []store.Node {
	var nodes []store.Node
	for i := 9; i >= 0; i-- { // out of order, as a store may list them
		n := store.Node{ID: fmt.Sprintf("n%d", i), Facts: &nodeproto.NodeFacts{Accelerators: []nodeproto.Accelerator{{UUID: fmt.Sprintf("G%d-a", i)}, {UUID: fmt.Sprintf("G%d-b", i)}}}}
		n.Cordoned = i == 3
		if i == 5 {
			n.Flags = []api.NodeFlag{{Kind: api.NodeFlagGPUDisputed, GPU: "G5-a"}}
		}
		if i == 6 { // returned to service: the note withholds nothing
			n.Flags = []api.NodeFlag{{Kind: api.NodeFlagGPUUncordoned, GPU: "G6-a"}}
		}
		nodes = append(nodes, n)
	}
	return nodes
}

func status(n store.Node) string {
	if n.ID == "n9" {
		return api.NodeUnreachable
	}
	return api.NodeReady
}

func busy(id string) []string {
	if id == "n1" || id == "n5" {
		return []string{"G" + id[1:] + "-a"} // n5's busy card is also flagged
	}
	return nil
}

func ids(nodes []store.Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.ID)
	}
	return out
}

func TestPagesInIDOrderWithTheFleetCounted(t *testing.T) {
	page, next, sum := Page(fleet(), Options{Limit: 4}, status, busy)
	if !reflect.DeepEqual(ids(page), []string{"n0", "n1", "n2", "n3"}) || next != "n3" {
		t.Fatalf("first page %v, next %q", ids(page), next)
	}
	want := api.FleetSummary{Nodes: map[string]int{"ready": 9, "unreachable": 1, "cordoned": 1}, GPUs: map[string]int{"busy": 1, "flagged": 1, "idle": 18}, Matching: 10}
	if !reflect.DeepEqual(sum, want) {
		t.Fatalf("summary %+v, want %+v", sum, want)
	}
	page, next, _ = Page(fleet(), Options{Limit: 4, After: "n7"}, status, busy)
	if !reflect.DeepEqual(ids(page), []string{"n8", "n9"}) || next != "" {
		t.Fatalf("last page %v, next %q", ids(page), next)
	}
	page, next, sum = Page(fleet(), Options{Limit: 1, Status: "cordoned"}, status, busy)
	if !reflect.DeepEqual(ids(page), []string{"n3"}) || next != "" || sum.Matching != 1 {
		t.Fatalf("cordoned: %v, next %q, matching %d (a full last page has no next only when nothing follows)", ids(page), next, sum.Matching)
	}
}

func TestParse(t *testing.T) {
	if _, ok, err := Parse(url.Values{}); ok || err != nil {
		t.Fatalf("no limit: paged %v, %v", ok, err)
	}
	o, ok, err := Parse(url.Values{"limit": {"100"}, "after": {"n3"}, "status": {"ready"}})
	if !ok || err != nil || o != (Options{Limit: 100, After: "n3", Status: "ready"}) {
		t.Fatalf("%+v %v %v", o, ok, err)
	}
	for _, q := range []url.Values{{"limit": {"0"}}, {"limit": {"1001"}}, {"limit": {"x"}}, {"limit": {"5"}, "status": {"sick"}}} {
		if _, _, err := Parse(q); err == nil {
			t.Errorf("%v accepted", q)
		}
	}
}
