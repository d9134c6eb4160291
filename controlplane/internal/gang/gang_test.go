package gang

import (
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

func plan() []scheduler.Placement {
	return []scheduler.Placement{
		{RunID: "a"}, {RunID: "g", Rank: 0}, {RunID: "g", Rank: 1}, {RunID: "g", Rank: 2}, {RunID: "b"}, {RunID: "h"}, {RunID: "h", Rank: 1},
	}
}

// TestUnitsAndChunksKeepGangsWhole: a gang's members form one unit, and a
// chunk ends only between units, so no gang is split across transactions.
func TestUnitsAndChunksKeepGangsWhole(t *testing.T) {
	units := Units(plan())
	if len(units) != 4 || len(units[1]) != 3 || len(units[3]) != 2 || units[2][0].RunID != "b" {
		t.Fatalf("units = %v", units)
	}
	for _, size := range []int{1, 2, 3, 100} {
		total := 0
		for _, chunk := range Chunks(plan(), size) {
			total += len(chunk)
			if last := chunk[len(chunk)-1]; last.RunID == "g" && last.Rank != 2 || last.RunID == "h" && last.Rank != 1 {
				t.Errorf("size %d: a chunk ends inside a gang: %v", size, chunk)
			}
			if u := Units(chunk); len(chunk)-len(u[len(u)-1]) >= size {
				t.Errorf("size %d: chunk %v was full before its last unit", size, chunk)
			}
		}
		if total != len(plan()) {
			t.Errorf("size %d: chunks hold %d placements, want %d", size, total, len(plan()))
		}
	}
}

// TestLaunchCarriesRankVariables: each member's launch has the run's env
// with the rank variables over it, and the gang's size.
func TestLaunchCarriesRankVariables(t *testing.T) {
	run := store.Run{Run: api.Run{ID: "r", RunSpec: api.RunSpec{Nodes: 4, GPUs: 8, Network: api.NetworkHost, Env: map[string]string{"A": "1", "RANK": "9"}}}}
	cmd := Launch(run, 7, 3, []string{"g1"}, MasterAddr(store.Node{ID: "n1", Facts: &nodeproto.NodeFacts{Hostname: "host-1"}}))
	l := cmd.LaunchWorkload
	want := map[string]string{"A": "1", "RANK": "3", "MERCATOR_RANK": "3", "WORLD_SIZE": "4", "MERCATOR_WORLD_SIZE": "4",
		"MASTER_ADDR": "host-1", "MERCATOR_MASTER_ADDR": "host-1", "MASTER_PORT": "29500", "MERCATOR_MASTER_PORT": "29500", "LOCAL_WORLD_SIZE": "8"}
	for k, v := range want {
		if l.Env[k] != v {
			t.Errorf("%s = %q, want %q", k, l.Env[k], v)
		}
	}
	if l.Attempt != 7 || l.GangSize != 4 || nodeproto.RequiredVersion(cmd) != nodeproto.VersionGang || run.Env["RANK"] != "9" {
		t.Errorf("launch %+v (needs version %d); the run's env %v must be left alone", l, nodeproto.RequiredVersion(cmd), run.Env)
	}
	run.MasterPort = 1234
	if got := Env(run, 0, MasterAddr(store.Node{ID: "n2"})); got["MASTER_PORT"] != "1234" || got["MASTER_ADDR"] != "n2" {
		t.Errorf("env with a port and no host name = %v", got)
	}
}
