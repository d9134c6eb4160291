package schedcopy

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
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

// nodeTable is a store's nodes as NodeReads sees them, counting the
// reads.
type nodeTable struct {
	recs        map[string]store.Node
	revs        map[string]int64
	all         int        // reads of every record
	recordReads [][]string // the IDs of each read of some records
}

func newNodeTable(nodes ...store.Node) *nodeTable {
	t := &nodeTable{recs: map[string]store.Node{}, revs: map[string]int64{}}
	for _, n := range nodes {
		t.put(n)
	}
	return t
}

func (t *nodeTable) put(n store.Node) { t.recs[n.ID] = n; t.revs[n.ID]++ }

// seen is the narrow write: the moment moves, the version stays.
func (t *nodeTable) seen(id string, at time.Time) {
	n := t.recs[id]
	n.LastSeenAt = &at
	t.recs[id] = n
}

func (t *nodeTable) reads() NodeReads {
	ids := func() []string { return slices.Sorted(maps.Keys(t.recs)) }
	return NodeReads{
		Versions: func() ([]store.NodeVersion, error) {
			var out []store.NodeVersion
			for _, id := range ids() {
				out = append(out, store.NodeVersion{ID: id, Rev: t.revs[id], LastSeenAt: t.recs[id].LastSeenAt})
			}
			return out, nil
		},
		Records: func(want []string) ([]store.Node, error) {
			t.recordReads = append(t.recordReads, want)
			var out []store.Node
			for _, id := range want {
				if n, ok := t.recs[id]; ok {
					out = append(out, n)
				}
			}
			return out, nil
		},
		All: func() ([]store.Node, error) {
			t.all++
			var out []store.Node
			for _, id := range ids() {
				out = append(out, t.recs[id])
			}
			return out, nil
		},
	}
}

func nodeIDs(nodes []store.Node) []string {
	var ids []string
	for _, n := range nodes {
		ids = append(ids, n.ID)
	}
	return ids
}

// TestNodesFollowsPatches holds the copy of the nodes' records to the
// store's read and the records written since, in ID order, until it is
// forgotten.
func TestNodesFollowsPatches(t *testing.T) {
	var c Copy
	table := newNodeTable(store.Node{ID: "a"}, store.Node{ID: "c"})
	if _, err := c.Nodes(time.Hour, table.reads()); err != nil {
		t.Fatal(err)
	}
	c.PatchNodes(map[string]store.Node{"b": {ID: "b"}, "c": {ID: "c", Cordoned: true}})
	nodes, err := c.Nodes(time.Hour, table.reads())
	if err != nil {
		t.Fatal(err)
	}
	if ids := nodeIDs(nodes); table.all != 1 || !reflect.DeepEqual(ids, []string{"a", "b", "c"}) || !nodes[2].Cordoned {
		t.Fatalf("after patches: %d reads, nodes %v (c cordoned: %v)", table.all, ids, nodes[2].Cordoned)
	}
	c.ForgetNodes()
	if _, err := c.Nodes(time.Hour, table.reads()); err != nil || table.all != 2 {
		t.Fatalf("after ForgetNodes: %d reads, err %v; want a second read of every record", table.all, err)
	}
}

// TestNodesReadsOnlyWhatChanged: a refresh reads the records of the nodes
// whose version moved (written by another replica, or patched here and so
// held at an unknown version) and of new nodes, and brings every other
// record's last-seen moment up to date without reading it.
func TestNodesReadsOnlyWhatChanged(t *testing.T) {
	var c Copy
	var all []store.Node
	for i := range 10 {
		all = append(all, store.Node{ID: fmt.Sprintf("n%02d", i)})
	}
	table := newNodeTable(all...)
	if _, err := c.Nodes(0, table.reads()); err != nil || table.all != 1 {
		t.Fatalf("first read: %d reads of every record, err %v; want 1", table.all, err)
	}
	t0 := time.Unix(1_700_000_000, 0).UTC()
	for _, n := range all {
		table.seen(n.ID, t0)
	}
	table.put(store.Node{ID: "n03", Cordoned: true, LastSeenAt: &t0}) // another replica's write
	table.put(store.Node{ID: "n10"})                                  // a new node
	mine := store.Node{ID: "n07", Draining: true, LastSeenAt: &t0}
	table.put(mine) // this replica's, committed, then patched
	c.PatchNodes(map[string]store.Node{"n07": mine})
	nodes, err := c.Nodes(0, table.reads())
	if err != nil {
		t.Fatal(err)
	}
	if table.all != 1 || len(table.recordReads) != 1 || !reflect.DeepEqual(table.recordReads[0], []string{"n03", "n07", "n10"}) {
		t.Fatalf("refresh read every record %d times and some %v; want [[n03 n07 n10]] only", table.all-1, table.recordReads)
	}
	if len(nodes) != 11 || nodes[10].ID != "n10" || !nodes[3].Cordoned || !nodes[7].Draining {
		t.Fatalf("nodes after refresh: %v (n03 cordoned %v, n07 draining %v)", nodeIDs(nodes), nodes[3].Cordoned, nodes[7].Draining)
	}
	for _, n := range nodes[:10] {
		if n.LastSeenAt == nil || !n.LastSeenAt.Equal(t0) {
			t.Errorf("%s: last seen %v, want %s", n.ID, n.LastSeenAt, t0)
		}
	}
	// Nothing written: only versions are read; the held records are not
	// changed in place (the list returned before still says never seen).
	table.seen("n01", t0.Add(time.Second))
	before := nodes
	if nodes, err = c.Nodes(0, table.reads()); err != nil || len(table.recordReads) != 1 || table.all != 1 {
		t.Fatalf("quiet refresh: %d more reads of some records, %d of all, err %v; want none", len(table.recordReads)-1, table.all-1, err)
	}
	if !nodes[1].LastSeenAt.Equal(t0.Add(time.Second)) || !before[1].LastSeenAt.Equal(t0) {
		t.Fatalf("n01 last seen %v in the new list, %v in the old; want %s and %s", nodes[1].LastSeenAt, before[1].LastSeenAt, t0.Add(time.Second), t0)
	}
	// Most records written: every record read in one go.
	for _, n := range all[:8] {
		table.put(n)
	}
	if _, err := c.Nodes(0, table.reads()); err != nil || table.all != 2 {
		t.Fatalf("after most records changed: %d reads of every record, err %v; want 2", table.all, err)
	}
}

// TestInvalidateDuringRebuild: a copy invalidated while its rebuild read
// the store is rebuilt again at the next Refresh, not trusted until the
// resync period (the read may have missed what the invalidation was for).
func TestInvalidateDuringRebuild(t *testing.T) {
	var c Copy
	reads := 0
	none := func([]string) ([]store.Run, error) { return nil, nil }
	active := func() ([]store.Run, error) {
		reads++
		if reads == 1 {
			c.Invalidate() // a lost signal heard mid-read
		}
		return nil, nil
	}
	for range 2 {
		if err := c.Refresh(time.Hour, active, none); err != nil {
			t.Fatal(err)
		}
	}
	if reads != 2 {
		t.Fatalf("%d rebuilds, want 2: the one read across Invalidate is stale", reads)
	}
	if err := c.Refresh(time.Hour, active, none); err != nil || reads != 2 {
		t.Fatalf("a third Refresh read again (%d reads, err %v): the second rebuild was current", reads, err)
	}
}

// TestMarkDirtyWithoutACopyKeepsNothing: marks for a copy that does not
// exist yet (a replica that does not schedule) are not kept, for either
// copy; once built, marks are kept and read.
func TestMarkDirtyWithoutACopyKeepsNothing(t *testing.T) {
	var c Copy
	var q Queue
	c.MarkDirty([]string{"a", "b"})
	q.MarkDirty([]string{"a", "b"})
	if len(c.dirty) != 0 || len(q.dirty) != 0 {
		t.Fatalf("marks kept without a copy: %v, %v", c.dirty, q.dirty)
	}
	none := func() ([]store.Run, error) { return nil, nil }
	var read []string
	byID := func(ids []string) ([]store.Run, error) { read = append(read, ids...); return nil, nil }
	if err := c.Refresh(time.Hour, none, byID); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Runs(time.Hour, none, byID); err != nil {
		t.Fatal(err)
	}
	c.MarkDirty([]string{"c"})
	q.MarkDirty([]string{"d"})
	if err := c.Refresh(time.Hour, none, byID); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Runs(time.Hour, none, byID); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(read, []string{"c", "d"}) {
		t.Fatalf("runs read again %v, want [c d]", read)
	}
}
