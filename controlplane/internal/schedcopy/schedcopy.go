// Package schedcopy is what the control plane's reconcile loop keeps
// between passes, so that a pass costs what changed rather than what
// exists. Before it, every pass (and one runs at every submission and every
// report that changes a run) decoded every node's record three times and
// every active run once: at ten thousand nodes and a hundred thousand
// running runs, seconds a pass.
//
// A Copy holds two things:
//
//   - A copy of the nodes' records, refreshed at most once per liveness
//     flush period: every node's version and last-seen moment are read,
//     and the records of the nodes whose version moved. Liveness is not judged on it alone (see package liveness), and
//     what else it carries (facts, cordons, drains) changes rarely; a
//     decision made on a copy that old was already possible when every
//     pass read the store, since placements are committed after the read.
//
//   - The resources held by active attempts (runs placed, preparing or
//     running), by run. The replica's own writes update it as they commit
//     (NoteRuns); runs written by other replicas are marked dirty
//     (MarkDirty) and read again at the next Refresh; and it is rebuilt
//     from the store when the replica becomes the leader (Invalidate) and
//     every resync period, which bounds the cost of a lost signal. A stale
//     entry is conservative: only the leader places, so what the copy can
//     miss is a release of resources (a run that ended elsewhere), which
//     delays a placement and never over-commits a node. Every placement is
//     still checked against the run's record in the transaction that
//     commits it.
//
// A Queue (queue.go) is the third: the leader's copy of the queued runs,
// kept the same way, so that a pass does not decode the whole backlog.
//
// The package reads no store itself: its caller passes the reads in
// (Copy.Nodes, Copy.Refresh). Only package controlplane may import it.
package schedcopy

import (
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/store"
)

// Copy is the reconcile loop's copies. The zero value is ready to use and
// holds nothing: the first Nodes and Refresh read the store. Its methods
// are safe for concurrent use.
type Copy struct {
	mu sync.Mutex

	nodes   []store.Node
	revs    map[string]int64 // the version of each record in nodes
	nodesAt time.Time
	patches map[string]store.Node // written here since nodes was read

	active   map[string]Usage // by run ID; nil until built
	perNode  map[string]*NodeUse
	builtAt  time.Time
	building bool
	invalid  uint64          // Invalidate's count: a rebuild read across one is stale at once
	during   []store.Run     // runs noted while a rebuild read the store
	dirty    map[string]bool // runs other replicas wrote, to read again
}

// Usage is what one active run holds, and where its current attempt is.
type Usage struct {
	Updated  time.Time
	CPU      float64
	Mem      int64
	Attempts []Attempt // the attempts that may hold resources
	Current  string    // the node of the current attempt, if it is active
	// What the scheduler reads of it when it plans by project.
	Teams Teams
}

// Attempt is where one attempt that may hold resources is, and its GPUs.
type Attempt struct {
	Node string
	GPUs []string
}

// NodeUse is what the active attempts on one node hold: the sums a pass
// adds to the node's view, kept as attempts come and go so that a pass
// costs O(nodes) rather than O(active runs).
type NodeUse struct {
	CPU      float64
	Mem      int64
	Attempts int
	GPUs     map[string]int // UUID → attempts holding it
}

// Teams is what the scheduler reads of an active run when it plans by
// project (docs/teams.md).
type Teams struct {
	Project  string
	Priority int
	Placed   time.Time // of the current attempt: newer victims go first
	Stopping bool      // the current attempt has a stop on its way
	GPUs     []string  // the current attempt's
	Deadline time.Time // when its timeout ends it, if it has one and started
	// Preempted is each reason its attempts were preempted for, with when.
	Preempted map[string]time.Time
}

// teamsOf is a run as Teams.
func teamsOf(r store.Run) Teams {
	t := Teams{Project: api.ProjectOf(r.Project), Priority: r.Priority}
	if a := lifecycle.Current(&r.Run); a != nil {
		t.Placed, t.Stopping, t.GPUs = a.PlacedAt, a.StopRequested, a.GPUs
		if r.TimeoutSeconds > 0 && a.StartedAt != nil {
			t.Deadline = a.StartedAt.Add(time.Duration(r.TimeoutSeconds) * time.Second)
		}
	}
	for _, a := range r.Attempts {
		if a.PreemptedFor != "" && a.PreemptedAt != nil {
			if t.Preempted == nil {
				t.Preempted = map[string]time.Time{}
			}
			if at, ok := t.Preempted[a.PreemptedFor]; !ok || a.PreemptedAt.After(at) {
				t.Preempted[a.PreemptedFor] = *a.PreemptedAt
			}
		}
	}
	return t
}

// UsageOf is what the copy counts for a run: every attempt that may still
// hold resources, replaced ones included (a replaced attempt can be alive
// on its node), of a run placed, preparing or running. False for a run in
// any other status.
func UsageOf(r store.Run) (Usage, bool) {
	switch r.Status {
	case api.RunPlaced, api.RunPreparing, api.RunRunning:
	default:
		return Usage{}, false
	}
	u := Usage{Updated: r.UpdatedAt, CPU: r.CPU, Mem: r.MemoryBytes}
	for _, a := range r.Attempts {
		if lifecycle.Active(a) {
			u.Attempts = append(u.Attempts, Attempt{Node: a.NodeID, GPUs: a.GPUs})
		}
	}
	u.Teams = teamsOf(r)
	if a := lifecycle.Current(&r.Run); a != nil && lifecycle.Active(*a) {
		u.Current = a.NodeID
	}
	return u, true
}

// add adds (sign 1) or removes (sign -1) a run's holdings. The caller
// holds mu.
func (c *Copy) add(u Usage, sign int) {
	for _, a := range u.Attempts {
		n := c.perNode[a.Node]
		if n == nil {
			n = &NodeUse{}
			c.perNode[a.Node] = n
		}
		n.CPU += float64(sign) * u.CPU
		n.Mem += int64(sign) * u.Mem
		n.Attempts += sign
		for _, g := range a.GPUs {
			if n.GPUs == nil {
				n.GPUs = map[string]int{}
			}
			if n.GPUs[g] += sign; n.GPUs[g] <= 0 {
				delete(n.GPUs, g)
			}
		}
		if n.Attempts <= 0 {
			delete(c.perNode, a.Node)
		}
	}
}

// NoteRuns applies runs this replica committed.
func (c *Copy) NoteRuns(runs map[string]store.Run) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range runs {
		if c.building {
			c.during = append(c.during, r)
		}
		c.apply(r)
	}
}

// apply puts one run's state in the copy, unless the copy already holds a
// later version of it. The caller holds mu.
func (c *Copy) apply(r store.Run) {
	if c.active == nil {
		return
	}
	cur, had := c.active[r.ID]
	if had && cur.Updated.After(r.UpdatedAt) {
		return
	}
	if had {
		c.add(cur, -1)
	}
	if u, ok := UsageOf(r); ok {
		c.active[r.ID] = u
		c.add(u, 1)
	} else {
		delete(c.active, r.ID)
	}
}

// MarkDirty records runs another replica wrote: the next Refresh reads
// them again. With no copy and none being built nothing is kept (the next
// Refresh rebuilds): a replica that never refreshed its copy kept every
// run ID the others wrote.
func (c *Copy) MarkDirty(ids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.active == nil && !c.building { // the next Refresh rebuilds: nothing to keep
		return
	}
	if c.dirty == nil {
		c.dirty = map[string]bool{}
	}
	for _, id := range ids {
		c.dirty[id] = true
	}
}

// Invalidate drops the copy of active attempts; the next Refresh rebuilds
// it, and a rebuild in progress counts as already stale. Called when the
// replica becomes the leader (while it was not, nothing guaranteed the
// copy followed the leader's placements) and when a signal was lost on the
// way (it may have named runs another replica wrote).
func (c *Copy) Invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active, c.perNode, c.builtAt = nil, nil, time.Time{}
	c.invalid++
}

// NodeReads are the reads Copy.Nodes makes of the store, each in a
// transaction of its own, Versions first. A record read after its version
// is at least as new as it; the copy keeps the version it read, so a
// record that changed in between is read again at the next refresh, never
// missed.
type NodeReads struct {
	// Versions is every node's version and last-seen moment, in ID order
	// (store.Tx.NodeVersions).
	Versions func() ([]store.NodeVersion, error)
	// Records is the records of ids, given sorted (store.Tx.GetNodes).
	Records func(ids []string) ([]store.Node, error)
	// All is every record in ID order (store.Tx.ListNodes), read instead
	// of Records when most records are to be read.
	All func() ([]store.Node, error)
}

// Nodes returns the copy of the nodes' records: refreshed when older than
// maxAge, with the records the replica wrote since applied (PatchNodes).
// A refresh reads every node's version and last-seen moment, and only
// the records whose version differs from the one the copy holds (or all
// of them, when most do); the rest keep their record with the moment
// brought up to date. The caller must not modify the slice or the
// records; a list returned again unchanged is the same slice.
func (c *Copy) Nodes(maxAge time.Duration, reads NodeReads) ([]store.Node, error) {
	c.mu.Lock()
	if c.nodes != nil && time.Since(c.nodesAt) < maxAge {
		if len(c.patches) > 0 {
			c.nodes = mergeNodes(c.nodes, c.patches)
			c.patches = nil
		}
		nodes := c.nodes
		c.mu.Unlock()
		return nodes, nil
	}
	// The store has the patches: their nodes' versions moved, so their
	// records are read again below.
	c.patches = nil
	held, revs := c.nodes, c.revs
	c.mu.Unlock()
	at := time.Now()
	nodes, newRevs, err := refreshNodes(held, revs, reads)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.patches) > 0 { // written while the store was read
		nodes = mergeNodes(nodes, c.patches)
		c.patches = nil
	}
	c.nodes, c.revs, c.nodesAt = nodes, newRevs, at
	return nodes, nil
}

// refreshNodes is one refresh of held (in ID order, each record at the
// version revs gives, if any): the new list and each record's version.
func refreshNodes(held []store.Node, revs map[string]int64, reads NodeReads) ([]store.Node, map[string]int64, error) {
	versions, err := reads.Versions()
	if err != nil {
		return nil, nil, err
	}
	newRevs := make(map[string]int64, len(versions))
	var stale []string
	for _, v := range versions {
		newRevs[v.ID] = v.Rev
		if r, ok := revs[v.ID]; !ok || r != v.Rev {
			stale = append(stale, v.ID)
		}
	}
	if len(stale)*2 > len(versions) {
		all, err := reads.All()
		if err != nil {
			return nil, nil, err
		}
		for _, n := range all {
			if _, ok := newRevs[n.ID]; !ok {
				newRevs[n.ID] = unknownRev // created after the versions were read
			}
		}
		return all, newRevs, nil
	}
	var read []store.Node
	if len(stale) > 0 {
		if read, err = reads.Records(stale); err != nil {
			return nil, nil, err
		}
	}
	// Walk the versions, the records held and the records read, all in ID
	// order: each node from what was read if it was, else from what was
	// held, with the moment the versions give.
	out := make([]store.Node, 0, len(versions))
	h, r := 0, 0
	for _, v := range versions {
		for r < len(read) && read[r].ID < v.ID {
			r++
		}
		if r < len(read) && read[r].ID == v.ID {
			out = append(out, read[r])
			continue
		}
		for h < len(held) && held[h].ID < v.ID {
			h++
		}
		if h < len(held) && held[h].ID == v.ID && revs[v.ID] == v.Rev {
			n := held[h]
			n.LastSeenAt = v.LastSeenAt
			out = append(out, n)
		}
		// Otherwise the node was stale and its record was not found:
		// left out, as a list read then would have.
	}
	return out, newRevs, nil
}

// unknownRev is the version of a record the copy holds without knowing
// its version: it differs from every stored one (they start at zero and
// grow), so the record is read again at the next refresh.
const unknownRev = -1

// mergeNodes returns a new list: base with patches applied, new nodes
// added, in ID order.
func mergeNodes(base []store.Node, patches map[string]store.Node) []store.Node {
	out := make([]store.Node, 0, len(base)+len(patches))
	seen := make(map[string]bool, len(patches))
	for _, n := range base {
		if p, ok := patches[n.ID]; ok {
			n = p
			seen[n.ID] = true
		}
		out = append(out, n)
	}
	added := false
	for id, p := range patches {
		if !seen[id] {
			out = append(out, p)
			added = true
		}
	}
	if added {
		sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	}
	return out
}

// PatchNodes notes records the replica committed, for the next Nodes.
func (c *Copy) PatchNodes(nodes map[string]store.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.patches == nil {
		c.patches = map[string]store.Node{}
	}
	for id, n := range nodes {
		c.patches[id] = n
	}
}

// Patched is how many records PatchNodes noted that no Nodes has taken in
// yet: what the next Nodes will merge, copying every node to do so.
func (c *Copy) Patched() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.patches)
}

// ForgetNodes makes the next Nodes read the store.
func (c *Copy) ForgetNodes() {
	c.mu.Lock()
	c.nodes, c.revs = nil, nil
	c.mu.Unlock()
}

// Refresh brings the copy of active attempts up to date: rebuilt from
// readActive (every run placed, preparing or running) when it is missing
// or older than resync, otherwise with the runs other replicas wrote
// (MarkDirty) read again with readRuns, which is given their IDs sorted
// and skips those no longer stored. On an error the dirty runs stay
// dirty.
func (c *Copy) Refresh(resync time.Duration, readActive func() ([]store.Run, error), readRuns func(ids []string) ([]store.Run, error)) error {
	c.mu.Lock()
	rebuild := c.active == nil || time.Since(c.builtAt) > resync
	var dirty []string
	if !rebuild {
		for id := range c.dirty {
			dirty = append(dirty, id)
		}
		c.dirty = nil
	}
	if rebuild {
		c.building, c.during, c.dirty = true, nil, nil
	}
	invalid := c.invalid
	c.mu.Unlock()

	if rebuild {
		at := time.Now()
		runs, err := readActive()
		c.mu.Lock()
		defer c.mu.Unlock()
		c.building = false
		if err != nil {
			c.during = nil
			return err
		}
		if c.invalid != invalid { // invalidated during the read: rebuilt again next time
			at = time.Time{}
		}
		c.active, c.perNode, c.builtAt = make(map[string]Usage, len(runs)), map[string]*NodeUse{}, at
		for _, r := range runs {
			c.apply(r)
		}
		for _, r := range c.during { // committed while the store was read
			c.apply(r)
		}
		c.during = nil
		return nil
	}
	if len(dirty) == 0 {
		return nil
	}
	sort.Strings(dirty)
	runs, err := readRuns(dirty)
	if err != nil {
		c.MarkDirty(dirty)
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range runs {
		c.apply(r)
	}
	return nil
}

// EachNode calls fn with what active attempts hold on each node that holds
// any, under the copy's lock: fn must be quick, must not keep u, and must
// not call back into the Copy.
func (c *Copy) EachNode(fn func(node string, u *NodeUse)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, u := range c.perNode {
		fn(id, u)
	}
}

// EachActive calls fn for every active run in the copy, under the copy's
// lock: fn must be quick and must not call back into the Copy.
func (c *Copy) EachActive(fn func(id string, u Usage)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, u := range c.active {
		fn(id, u)
	}
}

// EachNodeSum calls fn once per node that active attempts hold resources
// on, with their sums as one Usage of a single attempt on that node: a
// scheduler snapshot built from these costs O(nodes) rather than
// O(active runs). Under the copy's lock, as EachNode.
func (c *Copy) EachNodeSum(fn func(u Usage)) {
	c.EachNode(func(node string, n *NodeUse) {
		u := Usage{CPU: n.CPU, Mem: n.Mem, Attempts: []Attempt{{Node: node}}}
		for g := range n.GPUs {
			u.Attempts[0].GPUs = append(u.Attempts[0].GPUs, g)
		}
		fn(u)
	})
}

// Deadlines is when each active run with a timeout must end (its current
// attempt started, plus its timeout), earliest first: what a queued run's
// position is estimated from (project.Queue).
func (c *Copy) Deadlines() []time.Time {
	var out []time.Time
	c.EachActive(func(_ string, u Usage) {
		if !u.Teams.Deadline.IsZero() {
			out = append(out, u.Teams.Deadline)
		}
	})
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}
