package controlplane

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// schedState is what the reconcile loop keeps between passes, so that a
// pass costs what changed rather than what exists. Before it, every pass
// (and one runs at every submission and every report that changes a run)
// decoded every node's record three times and every active run once: at
// ten thousand nodes and a hundred thousand running runs, seconds a pass.
//
// It holds two things:
//
//   - A copy of the nodes' records, read at most once per liveness flush
//     period. Liveness is not judged on it alone (see package liveness), and
//     what else it carries (facts, cordons, drains) changes rarely; a
//     decision made on a copy that old was already possible when every
//     pass read the store, since placements are committed after the read.
//
//   - The resources held by active attempts (runs placed, preparing or
//     running), by run. This replica's own writes update it as they commit
//     (Server.update notes every run written); runs written by other
//     replicas arrive as "runs:" signals naming them, and are read again
//     at the next pass; and it is rebuilt from the store when this replica
//     becomes the leader and every resyncEvery, which bounds the cost of a
//     lost signal. A stale entry is conservative: only the leader places,
//     so what the copy can miss is a release of resources (a run that
//     ended elsewhere), which delays a placement and never over-commits a
//     node. Every placement is still checked against the run's record in
//     the transaction that commits it.
type schedState struct {
	mu sync.Mutex

	nodes   []store.Node
	nodesAt time.Time
	patches map[string]store.Node // written here since nodes was built
	// The scheduler's view of the nodes (status, capacity, inventory;
	// nothing about active attempts), built from nodes once per liveness
	// flush period or when nodes changed; a pass copies it and adds what
	// active attempts hold. Only the reconcile loop touches these.
	view      []scheduler.Node
	viewIndex map[string]int
	viewFrom  []store.Node
	viewAt    time.Time

	active   map[string]runUsage // by run ID; nil until built
	perNode  map[string]*nodeUse // what active holds, summed by node
	builtAt  time.Time
	building bool
	during   []store.Run     // runs noted while a rebuild read the store
	dirty    map[string]bool // runs other replicas wrote, to read again
}

// runUsage is what one active run holds, and where its current attempt is.
type runUsage struct {
	updated  time.Time
	cpu      float64
	mem      int64
	attempts []attemptUsage // the attempts that may hold resources
	current  string         // the node of the current attempt, if it is active
	// What the scheduler reads of it when it plans by project
	// (runs_teams.go).
	teams runTeams
}

type attemptUsage struct {
	node string
	gpus []string
}

// nodeUse is what the active attempts on one node hold: the sums a pass
// adds to the node's view, kept as attempts come and go so that a pass
// costs O(nodes) rather than O(active runs).
type nodeUse struct {
	cpu      float64
	mem      int64
	attempts int
	gpus     map[string]int // UUID → attempts holding it
}

// add adds (sign 1) or removes (sign -1) a run's holdings. The caller
// holds mu.
func (st *schedState) add(u runUsage, sign int) {
	for _, a := range u.attempts {
		n := st.perNode[a.node]
		if n == nil {
			n = &nodeUse{}
			st.perNode[a.node] = n
		}
		n.cpu += float64(sign) * u.cpu
		n.mem += int64(sign) * u.mem
		n.attempts += sign
		for _, g := range a.gpus {
			if n.gpus == nil {
				n.gpus = map[string]int{}
			}
			if n.gpus[g] += sign; n.gpus[g] <= 0 {
				delete(n.gpus, g)
			}
		}
		if n.attempts <= 0 {
			delete(st.perNode, a.node)
		}
	}
}

// resyncEvery is how often the copy of active attempts is rebuilt from the
// store: rarely with one replica (this one writes everything), more often
// when other replicas write runs too.
const (
	resyncAlone    = 10 * time.Minute
	resyncReplicas = time.Minute
)

// usageOf is what the snapshot counts for a run: every attempt that may
// still hold resources, replaced ones included (a replaced attempt can be
// alive on its node), of a run placed, preparing or running.
func usageOf(r store.Run) (runUsage, bool) {
	switch r.Status {
	case api.RunPlaced, api.RunPreparing, api.RunRunning:
	default:
		return runUsage{}, false
	}
	u := runUsage{updated: r.UpdatedAt, cpu: r.CPU, mem: r.MemoryBytes}
	for _, a := range r.Attempts {
		if lifecycle.Active(a) {
			u.attempts = append(u.attempts, attemptUsage{node: a.NodeID, gpus: a.GPUs})
		}
	}
	u.teams = teamsOf(r) // runs_teams.go
	if a := lifecycle.Current(&r.Run); a != nil && lifecycle.Active(*a) {
		u.current = a.NodeID
	}
	return u, true
}

// noteRuns applies runs this replica committed.
func (st *schedState) noteRuns(runs map[string]store.Run) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, r := range runs {
		if st.building {
			st.during = append(st.during, r)
		}
		st.apply(r)
	}
}

// apply puts one run's state in the copy, unless the copy already holds a
// later version of it. The caller holds mu.
func (st *schedState) apply(r store.Run) {
	if st.active == nil {
		return
	}
	cur, had := st.active[r.ID]
	if had && cur.updated.After(r.UpdatedAt) {
		return
	}
	if had {
		st.add(cur, -1)
	}
	if u, ok := usageOf(r); ok {
		st.active[r.ID] = u
		st.add(u, 1)
	} else {
		delete(st.active, r.ID)
	}
}

// markDirty records runs another replica wrote.
func (st *schedState) markDirty(ids []string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.dirty == nil {
		st.dirty = map[string]bool{}
	}
	for _, id := range ids {
		st.dirty[id] = true
	}
}

// invalidate drops the copy of active attempts; the next pass rebuilds it.
// Called when this replica becomes the leader: while it was not, nothing
// guaranteed the copy followed the leader's placements.
func (st *schedState) invalidate() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.active, st.perNode, st.builtAt = nil, nil, time.Time{}
}

// nodeListAge is how old a copy of the nodes' records may be for the
// scheduler and the metrics: the copy follows this replica's own writes
// (patchNodes), so alone it is read again once a minute; other replicas'
// writes, their liveness flushes included, are read once per flush period.
func (s *Server) nodeListAge() time.Duration {
	if s.coord != nil {
		return s.live.FlushPeriod()
	}
	return time.Minute
}

// nodeList returns the copy of the nodes' records: read from the store
// when older than maxAge, with the records this replica wrote since applied
// (patchNodes). The caller must not modify the slice or the records.
func (s *Server) nodeList(ctx context.Context, maxAge time.Duration) ([]store.Node, error) {
	st := &s.sched
	st.mu.Lock()
	if st.nodes != nil && time.Since(st.nodesAt) < maxAge {
		if len(st.patches) > 0 {
			st.nodes = mergeNodes(st.nodes, st.patches)
			st.patches = nil
		}
		nodes := st.nodes
		st.mu.Unlock()
		return nodes, nil
	}
	st.patches = nil // the store has them
	st.mu.Unlock()
	at := time.Now()
	var nodes []store.Node
	if err := s.store.View(ctx, func(tx store.Tx) error {
		var err error
		nodes, err = tx.ListNodes()
		return err
	}); err != nil {
		return nil, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.patches) > 0 { // written while the store was read
		nodes = mergeNodes(nodes, st.patches)
		st.patches = nil
	}
	st.nodes, st.nodesAt = nodes, at
	return nodes, nil
}

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

// patchNodes notes records this replica committed, for the next nodeList.
func (st *schedState) patchNodes(nodes map[string]store.Node) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.patches == nil {
		st.patches = map[string]store.Node{}
	}
	for id, n := range nodes {
		st.patches[id] = n
	}
}

// forgetNodes makes the next nodeList read the store.
func (st *schedState) forgetNodes() {
	st.mu.Lock()
	st.nodes = nil
	st.mu.Unlock()
}

// refreshUsage brings the copy of active attempts up to date: rebuilt from
// the store when it is missing or due, otherwise with the runs other
// replicas wrote read again.
func (s *Server) refreshUsage(ctx context.Context) error {
	st := &s.sched
	resync := resyncAlone
	if s.coord != nil {
		resync = resyncReplicas
	}
	st.mu.Lock()
	rebuild := st.active == nil || time.Since(st.builtAt) > resync
	var dirty []string
	if !rebuild {
		for id := range st.dirty {
			dirty = append(dirty, id)
		}
		st.dirty = nil
	}
	if rebuild {
		st.building, st.during, st.dirty = true, nil, nil
	}
	st.mu.Unlock()

	if rebuild {
		at := time.Now()
		var runs []store.Run
		err := s.store.View(ctx, func(tx store.Tx) error {
			var err error
			runs, err = tx.ListRuns(store.ListRunsOptions{Statuses: []string{api.RunPlaced, api.RunPreparing, api.RunRunning}})
			return err
		})
		st.mu.Lock()
		st.building = false
		if err != nil {
			st.during = nil
			st.mu.Unlock()
			return err
		}
		st.active, st.perNode, st.builtAt = make(map[string]runUsage, len(runs)), map[string]*nodeUse{}, at
		for _, r := range runs {
			st.apply(r)
		}
		for _, r := range st.during { // committed while the store was read
			st.apply(r)
		}
		st.during = nil
		st.mu.Unlock()
		return nil
	}
	if len(dirty) > 0 {
		sort.Strings(dirty)
		var runs []store.Run
		err := s.store.View(ctx, func(tx store.Tx) error {
			for _, id := range dirty {
				r, err := tx.GetRun(id)
				if errors.Is(err, failure.ErrNotFound) {
					continue
				}
				if err != nil {
					return err
				}
				runs = append(runs, r)
			}
			return nil
		})
		if err != nil {
			st.markDirty(dirty)
			return err
		}
		st.mu.Lock()
		for _, r := range runs {
			st.apply(r)
		}
		st.mu.Unlock()
	}
	return nil
}

// eachNode calls fn with what active attempts hold on each node that holds
// any, under the copy's lock: fn must be quick, must not keep u, and must
// not call back into schedState.
func (st *schedState) eachNode(fn func(node string, u *nodeUse)) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for id, u := range st.perNode {
		fn(id, u)
	}
}

// eachActive calls fn for every active run in the copy, under the copy's
// lock: fn must be quick and must not call back into schedState.
func (st *schedState) eachActive(fn func(id string, u runUsage)) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for id, u := range st.active {
		fn(id, u)
	}
}

// runsWritten is called once a transaction that wrote runs committed on
// this replica: the scheduler's copy follows, and other replicas hear which
// runs changed.
func (s *Server) runsWritten(runs map[string]store.Run) {
	s.sched.noteRuns(runs)
	if s.coord == nil {
		return
	}
	ids := make([]string, 0, len(runs))
	for id := range runs {
		ids = append(ids, id)
	}
	s.publishIDs(topicRunIDs, ids)
}

// runIDsTopic parses a "runs:" signal: the replica that sent it and the
// runs it names.
func runIDsTopic(topic string) (from string, ids []string) {
	rest := strings.TrimPrefix(topic, topicRunIDs)
	from, list, _ := strings.Cut(rest, ":")
	return from, strings.Split(list, ",")
}
