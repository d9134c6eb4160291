package schedcopy

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
)

func running(id, node string, cpu float64, gpus []string, at time.Time) store.Run {
	return store.Run{Run: api.Run{ID: id, RunSpec: api.RunSpec{CPU: cpu, MemoryBytes: 1 << 30}, Status: api.RunRunning, UpdatedAt: at,
		Attempts: []api.Attempt{{Number: 1, NodeID: node, GPUs: gpus, Status: api.AttemptRunning, PlacedAt: at}}}}
}

// sums is what EachNodeSum reports, by node.
func sums(c *Copy) map[string]Usage {
	out := map[string]Usage{}
	c.EachNodeSum(func(u Usage) { out[u.Attempts[0].Node] = u })
	return out
}

// TestRefreshAndNotes holds the copy of active attempts to the runs it was
// given: a rebuild, this replica's writes (an older version never replaces
// a newer one), and dirty runs read again, kept dirty when the read fails.
func TestRefreshAndNotes(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var c Copy
	a, b := running("a", "n0", 2, []string{"g0"}, t0), running("b", "n0", 1, nil, t0)
	active := func() ([]store.Run, error) { return []store.Run{a, b}, nil }
	none := func([]string) ([]store.Run, error) { t.Fatal("read dirty runs on a rebuild"); return nil, nil }
	if err := c.Refresh(time.Hour, active, none); err != nil {
		t.Fatal(err)
	}
	got := sums(&c)
	if u := got["n0"]; len(got) != 1 || u.CPU != 3 || u.Mem != 2<<30 || !reflect.DeepEqual(u.Attempts[0].GPUs, []string{"g0"}) {
		t.Fatalf("after a rebuild: %+v", got)
	}

	// a grows; an older version of it noted after that changes nothing.
	grown := running("a", "n0", 4, []string{"g0"}, t0.Add(time.Second))
	c.NoteRuns(map[string]store.Run{"a": grown})
	c.NoteRuns(map[string]store.Run{"a": a})
	if u := sums(&c)["n0"]; u.CPU != 5 {
		t.Fatalf("after a grew: %+v", u)
	}
	// a ends.
	ended := grown
	ended.Status, ended.UpdatedAt = api.RunSucceeded, t0.Add(time.Second)
	c.NoteRuns(map[string]store.Run{"a": ended})
	if u := sums(&c)["n0"]; u.CPU != 1 || len(u.Attempts[0].GPUs) != 0 {
		t.Fatalf("after a ended: %+v", u)
	}

	// b moved by another replica: read again at the next Refresh.
	moved := running("b", "n1", 1, nil, t0.Add(2*time.Second))
	c.MarkDirty([]string{"b"})
	failing := func([]string) ([]store.Run, error) { return nil, errors.New("store down") }
	if err := c.Refresh(time.Hour, active, failing); err == nil {
		t.Fatal("a failed read of dirty runs did not fail the refresh")
	}
	var asked []string
	byID := func(ids []string) ([]store.Run, error) { asked = ids; return []store.Run{moved}, nil }
	if err := c.Refresh(time.Hour, active, byID); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(asked, []string{"b"}) {
		t.Fatalf("read again %v, want [b] (kept dirty after the failed read)", asked)
	}
	got = sums(&c)
	if _, ok := got["n0"]; ok || got["n1"].CPU != 1 {
		t.Fatalf("after b moved: %+v", got)
	}
	var current []string
	c.EachActive(func(id string, u Usage) { current = append(current, id+"@"+u.Current) })
	if !reflect.DeepEqual(current, []string{"b@n1"}) {
		t.Fatalf("active runs %v, want [b@n1]", current)
	}
}

// TestNodesFollowsPatches holds the copy of the nodes' records to the
// store's read and the records written since, in ID order, until it is
// forgotten.
func TestNodesFollowsPatches(t *testing.T) {
	var c Copy
	reads := 0
	read := func() ([]store.Node, error) { reads++; return []store.Node{{ID: "a"}, {ID: "c"}}, nil }
	if _, err := c.Nodes(time.Hour, read); err != nil {
		t.Fatal(err)
	}
	c.PatchNodes(map[string]store.Node{"b": {ID: "b"}, "c": {ID: "c", Cordoned: true}})
	nodes, err := c.Nodes(time.Hour, read)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, n := range nodes {
		ids = append(ids, n.ID)
	}
	if reads != 1 || !reflect.DeepEqual(ids, []string{"a", "b", "c"}) || !nodes[2].Cordoned {
		t.Fatalf("after patches: %d reads, nodes %v (c cordoned: %v)", reads, ids, nodes[2].Cordoned)
	}
	c.ForgetNodes()
	if _, err := c.Nodes(time.Hour, read); err != nil || reads != 2 {
		t.Fatalf("after ForgetNodes: %d reads, err %v; want a second read", reads, err)
	}
}
