package scheduler

// Teams: projects, quotas, borrowing, priorities and fair share
// (docs/teams.md). When a Snapshot names projects, Schedule plans with
// this policy on top of the placement policy of the package doc, which
// still decides which node a run goes to:
//
//   - A project's quota (GPUs by model word, CPU, memory) is what it is
//     guaranteed. A run whose project stays within its quota with it is
//     guaranteed work; every other run borrows: it runs only on capacity
//     nobody's guaranteed work needs now, and is the first reclaimed.
//   - Within a project, runs go by priority (higher first), then in the
//     order of Snapshot.Pending (submission order). A run that does not fit
//     does not hold back the smaller ones behind it.
//   - Across projects, the next run considered is always from the project
//     with the least weighted dominant share: the larger of its share of
//     the fleet's CPU, memory and each GPU kind, held now, plus its
//     History (the decayed share it held over past minutes, which the
//     control plane keeps), divided by its weight. No project starves, and
//     a burst is remembered for a while but not for a week.
//   - Guaranteed work of every project is placed first, in that order;
//     then borrowing work, in that order again.
//   - What is still waiting may preempt (preempt.go).
//
// A GPU counts against the quota model word its model contains; a run that
// names no model counts against the model of the node it lands on, and one
// whose devices match no word of any quota borrows them.

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/mercator/mercator/internal/bytesize"
)

// Project is one project as the scheduler sees it. The caller owns it.
type Project struct {
	Name string
	// GPUs is the guaranteed devices by model word, matched
	// case-insensitively against devices' model names ("H100" counts
	// "NVIDIA H100 80GB HBM3"); CPU and MemoryBytes the guaranteed CPU and
	// memory. What is not named is guaranteed at zero.
	GPUs        map[string]int
	CPU         float64
	MemoryBytes int64
	// MaxRunning, when positive, caps the project's running and placed
	// runs, borrowed or not.
	MaxRunning int
	// Weight is its share of contended capacity against the others'; 0
	// reads as 1.
	Weight float64
	// History is the project's decayed dominant share of the fleet over
	// the recent past (0 to 1), kept by the caller, which alone reads a
	// clock; 0 when it has none.
	History float64
	// FunctionCPU and FunctionMemoryBytes are what the project's function
	// containers hold now, in nodes' function shares: they count against
	// its quota and its share like running work, but are not preempted
	// here (their engine scales them).
	FunctionCPU         float64
	FunctionMemoryBytes int64
}

// Running is one running (or placed) attempt, for quota accounting and
// preemption. Its resources are already in its node's Used figures.
type Running struct {
	RunID   string
	NodeID  string
	Project string
	// Priority is its run's; Order grows with the time it started, so that
	// among equal victims the newest, which loses the least work, goes
	// first.
	Priority    int
	Order       int64
	CPU         float64
	MemoryBytes int64
	GPUs        []string
	// Stopping is true once a stop was asked for (a preemption, a cancel):
	// its resources are about to be free, so it is never chosen again,
	// and a run waiting for them preempts nothing more.
	Stopping bool
	// PreemptedFor holds the Preemption.Key of every preemption of this
	// run within the caller's window; it is not preempted again for those.
	PreemptedFor []string
}

// dimension indexes of a resource vector: CPU, memory, then one per GPU
// model word of any quota, then every other GPU.
const (
	dimCPU = iota
	dimMem
	dimGPU0
)

// teams is one planning call with projects.
type teams struct {
	s        *Snapshot
	x        *index
	plan     *Plan
	words    []string // lowercased GPU quota words, sorted
	display  []string // the words as the quotas spell them
	dimOf    map[string]int
	slotDim  [][]int   // by node and GPU slot (eligible nodes only)
	capacity []float64 // on nodes that can take work
	free     []float64 // of capacity, not held: what can be borrowed
	projects []*projectState
	byName   map[string]*projectState
	nodeOf   map[string]int32
}

// projectState is one project during one call.
type projectState struct {
	name     string
	quota    []float64
	used     []float64
	running  int
	max      int
	weight   float64
	history  float64
	queue    []int32 // pending runs by priority, then order
	deferred []int32 // runs left for the borrowing pass
	share    float64
	slot     int // heap position
}

// scheduleTeams is Schedule when the snapshot names projects.
func scheduleTeams(s Snapshot) Plan {
	t := newTeams(&s)
	for _, p := range t.projects {
		p.queue = t.orderQueue(p.queue)
	}
	t.pass(func(p *projectState) *[]int32 { return &p.queue }, t.tryGuaranteed)
	t.pass(func(p *projectState) *[]int32 { return &p.deferred }, t.tryBorrowing)
	t.preempt()
	t.plan.Shares = make(map[string]float64, len(t.projects))
	for _, ps := range t.projects {
		t.plan.Shares[ps.name] = t.dominant(ps)
	}
	t.plan.Order = t.queueOrder() // queueorder.go
	return *t.plan
}

func newTeams(s *Snapshot) *teams {
	t := &teams{s: s, x: newIndex(s.Nodes), plan: &Plan{Waiting: map[string]string{}}, dimOf: map[string]int{},
		byName: map[string]*projectState{}, nodeOf: make(map[string]int32, len(s.Nodes))}
	seen := map[string]string{}
	for _, p := range s.Projects {
		for w := range p.GPUs {
			seen[strings.ToLower(w)] = w
		}
	}
	for _, w := range slicesSortedKeys(seen) {
		t.words, t.display = append(t.words, w), append(t.display, seen[w])
	}
	n := dimGPU0 + len(t.words) + 1
	t.capacity, t.free = make([]float64, n), make([]float64, n)
	for i := range s.Projects {
		p := &s.Projects[i]
		ps := t.project(p.Name)
		ps.quota[dimCPU], ps.quota[dimMem] = p.CPU, float64(p.MemoryBytes)
		for w, count := range p.GPUs {
			ps.quota[t.dim(w)] += float64(count)
		}
		ps.max, ps.history = p.MaxRunning, p.History
		ps.used[dimCPU] += p.FunctionCPU
		ps.used[dimMem] += float64(p.FunctionMemoryBytes)
		if p.Weight > 0 {
			ps.weight = p.Weight
		}
	}
	for i := range t.x.nodes {
		t.nodeOf[s.Nodes[i].ID] = int32(i)
	}
	t.slotDim = make([][]int, len(t.x.nodes))
	for _, ni := range t.x.eligible {
		ns := &t.x.nodes[ni]
		t.capacity[dimCPU] += ns.node.CPU
		t.capacity[dimMem] += float64(ns.node.MemoryBytes)
		t.free[dimCPU] += max(ns.freeCPU, 0)
		t.free[dimMem] += float64(max(ns.freeMem, 0))
		t.slotDim[ni] = make([]int, len(ns.gpus))
		for k := range ns.gpus {
			d := t.dim(ns.models[k])
			t.slotDim[ni][k] = d
			t.capacity[d]++
			if !ns.used[k] {
				t.free[d]++
			}
		}
	}
	for i := range s.Running {
		r := &s.Running[i]
		ps := t.project(r.Project)
		ps.running++
		ps.used[dimCPU] += r.CPU
		ps.used[dimMem] += float64(r.MemoryBytes)
		for _, d := range t.gpuDims(r.NodeID, r.GPUs) {
			ps.used[d]++
		}
	}
	for i := range s.Pending {
		ps := t.project(s.Pending[i].Project)
		ps.queue = append(ps.queue, int32(i))
	}
	for _, ps := range t.projects {
		t.reshare(ps)
	}
	return t
}

// slicesSortedKeys is m's keys in order.
func slicesSortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// project is the state of the named project ("" is "default"), made on
// first sight for one the snapshot does not describe (no quota, weight 1).
func (t *teams) project(name string) *projectState {
	if name == "" {
		name = "default"
	}
	ps := t.byName[name]
	if ps == nil {
		n := len(t.capacity)
		ps = &projectState{name: name, quota: make([]float64, n), used: make([]float64, n), weight: 1}
		t.byName[name] = ps
		t.projects = append(t.projects, ps)
	}
	return ps
}

// dim is the dimension of a GPU model (or quota word): the first quota
// word it contains, or the last dimension, every other GPU.
func (t *teams) dim(model string) int {
	if d, ok := t.dimOf[model]; ok {
		return d
	}
	lower := strings.ToLower(model)
	d := dimGPU0 + len(t.words)
	for i, w := range t.words {
		if strings.Contains(lower, w) {
			d = dimGPU0 + i
			break
		}
	}
	t.dimOf[model] = d
	return d
}

// gpuDims is the dimension of each of an attempt's GPUs on its node.
func (t *teams) gpuDims(nodeID string, uuids []string) []int {
	if len(uuids) == 0 {
		return nil
	}
	out := make([]int, 0, len(uuids))
	ni, ok := t.nodeOf[nodeID]
	for _, u := range uuids {
		d := dimGPU0 + len(t.words)
		if ok {
			for _, g := range t.s.Nodes[ni].GPUs {
				if g.UUID == u {
					d = t.dim(g.Model)
					break
				}
			}
		}
		out = append(out, d)
	}
	return out
}

// runDim is the GPU dimension a run counts against before it is placed:
// -1 for a CPU run, and -2 when only the node it lands on can say (it
// names no model, or one no quota word is part of).
func (t *teams) runDim(r *Run) int {
	if r.GPUs <= 0 {
		return -1
	}
	if r.GPUModel == "" {
		return -2
	}
	model := strings.ToLower(r.GPUModel)
	for i, w := range t.words {
		if strings.Contains(model, w) {
			return dimGPU0 + i
		}
	}
	return -2
}

// nodeDim is the GPU dimension a run placed on node ni counts against.
func (t *teams) nodeDim(ni int32, sh *shape) int {
	n := &t.x.nodes[ni]
	for k, g := range n.gpus {
		if matches(n.models[k], g.MemoryBytes, sh) {
			return t.slotDim[ni][k]
		}
	}
	return dimGPU0 + len(t.words)
}

// over is the first dimension in which the project would pass its quota
// with the run, every member of a gang counted (GPUs in dimension gd, none
// when gd < 0), or -1 when it would stay within it.
func (ps *projectState) over(r *Run, gd int) int {
	for _, d := range []int{gd, dimCPU, dimMem} {
		if d >= 0 && ps.used[d]+need(r, d) > ps.quota[d]+1e-9 {
			return d
		}
	}
	return -1
}

// atCap reports whether the project may start no more runs.
func (ps *projectState) atCap() bool { return ps.max > 0 && ps.running >= ps.max }

// orderQueue sorts a project's pending runs by priority, higher first,
// keeping Pending's order among equals.
func (t *teams) orderQueue(q []int32) []int32 {
	slices.SortStableFunc(q, func(a, b int32) int { return t.s.Pending[b].Priority - t.s.Pending[a].Priority })
	return q
}

// reshare recomputes a project's weighted dominant share.
func (t *teams) reshare(ps *projectState) {
	ps.share = (t.dominant(ps) + ps.history) / ps.weight
}

// dominant is the largest share of any resource of the fleet the project
// holds.
func (t *teams) dominant(ps *projectState) float64 {
	d := 0.0
	for k, c := range t.capacity {
		if c > 0 {
			d = math.Max(d, ps.used[k]/c)
		}
	}
	return d
}

// pass offers every run of the queue each project's field names to try,
// taking the next from the project with the least share each time. try
// reports whether it placed the run (which changes the project's share).
func (t *teams) pass(field func(*projectState) *[]int32, try func(*projectState, int32) bool) {
	h := &shareHeap{}
	for _, ps := range t.projects {
		if len(*field(ps)) > 0 {
			heap.Push(h, ps)
		}
	}
	for h.Len() > 0 {
		ps := heap.Pop(h).(*projectState)
		q := field(ps)
		// The project stays the least shared while its share does not
		// change, so its runs are taken without going back to the heap
		// until one is placed.
		for len(*q) > 0 {
			i := (*q)[0]
			*q = (*q)[1:]
			if try(ps, i) {
				break
			}
		}
		if len(*q) > 0 {
			heap.Push(h, ps)
		}
	}
}

// tryGuaranteed places run i if its project stays within its quota with
// it; anything else is deferred to the borrowing pass.
func (t *teams) tryGuaranteed(ps *projectState, i int32) bool {
	r := &t.s.Pending[i]
	gd := t.runDim(r)
	if ps.atCap() || ps.over(r, gd) >= 0 {
		ps.deferred = append(ps.deferred, i)
		return false
	}
	sh := shapeOf(r)
	if r.Nodes > 1 { // gang_teams.go
		return t.tryGang(ps, i, sh, gd, true)
	}
	ni := t.x.place(r, sh)
	if ni < 0 {
		ps.deferred = append(ps.deferred, i)
		return false
	}
	if gd == -2 && ps.over(r, t.nodeDim(ni, &sh)) >= 0 {
		ps.deferred = append(ps.deferred, i)
		return false
	}
	t.commit(ps, r, ni, sh)
	return true
}

// tryBorrowing places run i anywhere it fits, within the project's cap,
// and explains why not otherwise.
func (t *teams) tryBorrowing(ps *projectState, i int32) bool {
	r := &t.s.Pending[i]
	if ps.atCap() {
		t.plan.Waiting[r.ID] = fmt.Sprintf("waiting: project %s is at its cap of %d running runs", ps.name, ps.max)
		return false
	}
	sh := shapeOf(r)
	if r.Nodes > 1 { // gang_teams.go
		if t.tryGang(ps, i, sh, -1, false) {
			return true
		}
	} else if ni := t.x.place(r, sh); ni >= 0 {
		t.commit(ps, r, ni, sh)
		return true
	}
	// The quota is the reason when the run needs to borrow more than the
	// fleet has free; otherwise the nodes are, as without projects.
	if d := ps.over(r, t.runDim(r)); d >= 0 && t.free[d] < need(r, d)-1e-9 {
		t.plan.Waiting[r.ID] = "waiting: " + t.quotaText(ps, d)
		return false
	}
	if r.Nodes > 1 {
		t.plan.Waiting[r.ID] = gangText(r, sh, len(t.x.findGang(r, sh)))
	} else {
		t.plan.Waiting[r.ID] = t.x.explain(sh)
	}
	return false
}

// need is what run r asks of dimension d, every member of a gang counted.
func need(r *Run, d int) float64 {
	members := float64(max(1, r.Nodes))
	switch d {
	case dimCPU:
		return members * r.CPU
	case dimMem:
		return members * float64(r.MemoryBytes)
	}
	return members * float64(r.GPUs)
}

// commit records a placement and its cost to the project.
func (t *teams) commit(ps *projectState, r *Run, ni int32, sh shape) {
	t.commitMembers(ps, r, []int32{ni}, sh)
}

// commitMembers records a run's placement on nodes, one member a node
// ranked in that order (one node for a run that is not a gang), and what
// they cost the project: every member's resources, and one run against
// its cap.
func (t *teams) commitMembers(ps *projectState, r *Run, nodes []int32, sh shape) {
	for rank, ni := range nodes {
		gpus := t.x.commit(ni, r, sh)
		t.plan.Placements = append(t.plan.Placements, Placement{RunID: r.ID, NodeID: t.x.nodes[ni].node.ID, GPUs: gpus, Rank: rank})
		ps.used[dimCPU] += r.CPU
		ps.used[dimMem] += float64(r.MemoryBytes)
		t.free[dimCPU] -= r.CPU
		t.free[dimMem] -= float64(r.MemoryBytes)
		if len(gpus) > 0 {
			d := t.nodeDim(ni, &sh)
			ps.used[d] += float64(len(gpus))
			t.free[d] -= float64(len(gpus))
		}
	}
	ps.running++
	t.reshare(ps)
}

// quotaText says that a project is at its quota in dimension d, with how
// much it holds and how much of the fleet is free to borrow:
// "project vision is at its quota of 16 H100 (16 in use, 0 borrowable)".
func (t *teams) quotaText(ps *projectState, d int) string {
	free := math.Max(t.free[d], 0)
	switch {
	case d == dimCPU:
		return fmt.Sprintf("project %s is at its quota of %g CPUs (%g in use, %g borrowable)", ps.name, ps.quota[d], ps.used[d], free)
	case d == dimMem:
		return fmt.Sprintf("project %s is at its quota of %s memory (%s in use, %s borrowable)", ps.name,
			bytesize.Format(int64(ps.quota[d])), bytesize.Format(int64(ps.used[d])), bytesize.Format(int64(free)))
	case d-dimGPU0 < len(t.words):
		return fmt.Sprintf("project %s is at its quota of %g %s (%g in use, %g borrowable)", ps.name, ps.quota[d], t.display[d-dimGPU0], ps.used[d], free)
	}
	return fmt.Sprintf("project %s has no quota for these GPUs (%g in use, %g borrowable)", ps.name, ps.used[d], free)
}

// shareHeap orders projects by share, then name.
type shareHeap []*projectState

func (h shareHeap) Len() int { return len(h) }
func (h shareHeap) Less(i, j int) bool {
	if h[i].share != h[j].share {
		return h[i].share < h[j].share
	}
	return h[i].name < h[j].name
}
func (h shareHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].slot = i; h[j].slot = j }
func (h *shareHeap) Push(v any)   { p := v.(*projectState); p.slot = len(*h); *h = append(*h, p) }
func (h *shareHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	*h = old[:len(old)-1]
	return p
}
