package scheduler

// Preemption, decided in the plan from the snapshot (docs/teams.md). A run
// still waiting after both passes of projects.go may have running attempts
// stopped to make room for it, and only these:
//
//   - borrowed work: an attempt of another project that is over its quota
//     in the resource the waiting run needs, by at least the attempt's
//     share of it (taking it leaves its project at or above its quota), and
//     only for a waiting run whose own project stays within its quota with
//     it: borrowed capacity is reclaimed for guaranteed work;
//   - lower-priority work of the waiting run's own project.
//
// Why it cannot loop: a reclaim moves capacity from a project over its
// quota to one that stays within it, so the victim's requeued run is
// borrowing and can never reclaim it back; a priority preemption goes
// strictly downwards in one project. And an attempt preempted once is not
// preempted again for the same reason (Preemption.Key) while the caller
// keeps it in Running.PreemptedFor.
//
// One node per waiting run: the one that needs the fewest victims (borrowed
// ones first, then lower priority, then the newest), lowest rank among
// equals. Attempts already stopping count as free, so a run whose room is
// being freed waits for it instead of preempting more; and a node chosen
// once in a plan is not chosen again in it. At most maxPreemptors waiting
// runs are considered per plan, which bounds its cost: the next plan goes
// on where this one stopped.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Preemption is one attempt the plan stops, and why.
type Preemption struct {
	RunID  string // the victim
	NodeID string
	// By is the waiting run it makes room for, at ByPriority.
	By         string
	ByPriority int
	// Key is the reason as a word ("reclaim:nlp", "priority:nlp"), what
	// Running.PreemptedFor holds; Reason is it in a sentence for the
	// victim's attempt: "preempted by r-… (priority 100) to reclaim
	// project nlp's quota".
	Key    string
	Reason string
}

// maxPreemptors bounds the waiting runs considered for preemption in one
// plan.
const maxPreemptors = 64

// victimKind orders victims: borrowed work first.
type victimKind uint8

const (
	reclaim victimKind = iota
	lowerPriority
	notVictim
)

// preemption is the preemption pass's state.
type preemption struct {
	t      *teams
	byNode map[int32][]*victim
	nodes  []int32 // with running attempts, in rank order
	taken  map[int32]bool
	tried  map[string]bool
	// lowest is the lowest priority each project runs at: a run at or
	// below it, and within no quota, has nothing to preempt.
	lowest map[*projectState]int
}

// victim is a running attempt with what the pass reads of it, worked out
// once.
type victim struct {
	*Running
	project *projectState
	gpuDims []int
	chosen  bool // in this plan already
}

func (t *teams) preempt() {
	if len(t.s.Running) == 0 || len(t.plan.Waiting) == 0 {
		return
	}
	p := &preemption{t: t, byNode: map[int32][]*victim{}, taken: map[int32]bool{}, tried: map[string]bool{},
		lowest: map[*projectState]int{}}
	for i := range t.s.Running {
		r := &t.s.Running[i]
		v := &victim{Running: r, project: t.project(r.Project), gpuDims: t.gpuDims(r.NodeID, r.GPUs)}
		if low, ok := p.lowest[v.project]; !ok || r.Priority < low {
			p.lowest[v.project] = r.Priority
		}
		if ni, ok := t.nodeOf[r.NodeID]; ok && t.x.nodes[ni].static == fits {
			if p.byNode[ni] == nil {
				p.nodes = append(p.nodes, ni)
			}
			p.byNode[ni] = append(p.byNode[ni], v)
		}
	}
	waiting := map[*projectState][]int32{}
	for i := range t.s.Pending {
		r := &t.s.Pending[i]
		if _, waits := t.plan.Waiting[r.ID]; waits && r.Nodes <= 1 { // nothing is preempted for a gang (gang.go)
			ps := t.project(r.Project)
			waiting[ps] = append(waiting[ps], int32(i))
		}
	}
	slices.SortFunc(p.nodes, func(a, b int32) int { return cmp.Compare(t.x.nodes[a].rank, t.x.nodes[b].rank) })
	considered := 0
	for _, ps := range t.sharedOrder() {
		for _, i := range t.orderQueue(waiting[ps]) {
			if considered == maxPreemptors {
				return
			}
			if p.consider(ps, i) {
				considered++
			}
		}
	}
}

// sharedOrder is the projects by share, least first.
func (t *teams) sharedOrder() []*projectState {
	out := slices.Clone(t.projects)
	slices.SortFunc(out, func(a, b *projectState) int {
		return cmp.Or(cmp.Compare(a.share, b.share), cmp.Compare(a.name, b.name))
	})
	return out
}

// consider looks for room for waiting run i by preemption, and reports
// whether it searched (false when nothing could be preempted for it at all,
// which costs nothing and counts against no budget).
func (p *preemption) consider(ps *projectState, i int32) bool {
	t := p.t
	r := &t.s.Pending[i]
	if low, ok := p.lowest[ps]; (!ok || r.Priority <= low) && t.runDim(r) != -2 && ps.over(r, t.runDim(r)) >= 0 {
		return false // nothing lower to preempt, and no quota to reclaim
	}
	sh := shapeOf(r)
	memo := fmt.Sprintf("%s\x00%d\x00%v", ps.name, r.Priority, sh.key())
	if p.tried[memo] {
		return false
	}
	best, bestVictims, bestFreed := int32(-1), []*victim(nil), false
	for _, ni := range p.nodes {
		if p.taken[ni] {
			continue
		}
		victims, ok := p.onNode(ps, r, &sh, ni)
		if !ok {
			continue
		}
		if len(victims) == 0 { // being freed already: wait for it
			best, bestVictims, bestFreed = ni, nil, true
			break
		}
		if best < 0 || len(victims) < len(bestVictims) {
			best, bestVictims = ni, victims
		}
	}
	if best < 0 {
		p.tried[memo] = true
		return true
	}
	p.taken[best] = true
	nodeID := t.x.nodes[best].node.ID
	ps.used[dimCPU] += r.CPU // held for the run until the victims stop
	ps.used[dimMem] += float64(r.MemoryBytes)
	if sh.gpus > 0 {
		ps.used[t.nodeDim(best, &sh)] += float64(sh.gpus)
	}
	if bestFreed {
		t.plan.Waiting[r.ID] = fmt.Sprintf("waiting: room is being freed for it on %s (a stopping attempt)", nodeID)
		return true
	}
	var ids []string
	d := p.dimension(r, &sh, best)
	for _, v := range bestVictims {
		kind := p.kind(ps, r, d, v)
		key, why := "reclaim:"+ps.name, fmt.Sprintf("to reclaim project %s's quota", ps.name)
		if kind == lowerPriority {
			key, why = "priority:"+ps.name, fmt.Sprintf("a higher-priority run of project %s", ps.name)
		}
		t.plan.Preemptions = append(t.plan.Preemptions, Preemption{RunID: v.RunID, NodeID: nodeID, By: r.ID, ByPriority: r.Priority,
			Key: key, Reason: fmt.Sprintf("preempted by %s (priority %d) %s", r.ID, r.Priority, why)})
		v.chosen = true
		p.release(v)
		ids = append(ids, v.RunID)
	}
	t.plan.Waiting[r.ID] = fmt.Sprintf("waiting: preempting %s on %s to make room", strings.Join(ids, ", "), nodeID)
	return true
}

// release takes a victim's resources off its project's figures.
func (p *preemption) release(v *victim) {
	v.project.running--
	v.project.take(v)
}

// take subtracts an attempt's resources from the project's use.
func (ps *projectState) take(v *victim) {
	ps.used[dimCPU] -= v.CPU
	ps.used[dimMem] -= float64(v.MemoryBytes)
	for _, d := range v.gpuDims {
		ps.used[d]--
	}
}

// dimension is the resource a run needs most on node ni, the one a reclaim
// for it is counted in: its GPU kind there, else CPU, else memory.
func (p *preemption) dimension(r *Run, sh *shape, ni int32) int {
	switch {
	case sh.gpus > 0:
		return p.t.nodeDim(ni, sh)
	case r.CPU > 0:
		return dimCPU
	}
	return dimMem
}

// onNode is the victims that make room for r on node ni, fewest first by
// the greedy order, and whether any do (an empty list: the node has room
// once its stopping attempts are gone).
func (p *preemption) onNode(ps *projectState, r *Run, sh *shape, ni int32) ([]*victim, bool) {
	n := &p.t.x.nodes[ni]
	if sh.cpu > n.node.CPU || sh.mem > n.node.MemoryBytes || (sh.gpus > 0 && p.t.x.matching(n.sig, sh) < sh.gpus) {
		return nil, false // too small even empty
	}
	d := p.dimension(r, sh, ni)
	var stopping, candidates []*victim
	for _, v := range p.byNode[ni] {
		switch {
		case v.Stopping:
			stopping = append(stopping, v)
		case !v.chosen && p.kind(ps, r, d, v) != notVictim:
			candidates = append(candidates, v)
		}
	}
	if len(stopping) == 0 && len(candidates) == 0 {
		return nil, false
	}
	if p.fitsWithout(ni, sh, stopping) {
		return nil, len(stopping) > 0
	}
	slices.SortFunc(candidates, func(a, b *victim) int {
		return cmp.Or(cmp.Compare(p.kind(ps, r, d, a), p.kind(ps, r, d, b)), cmp.Compare(a.Priority, b.Priority), cmp.Compare(b.Order, a.Order))
	})
	// Taking borrowed work lowers its project's excess; each victim must
	// still leave its project at or above its quota, so the check is
	// made with the figures as the earlier victims leave them.
	var victims []*victim
	saved := map[*projectState][]float64{}
	defer func() {
		for q, used := range saved {
			q.used = used
		}
	}()
	for _, v := range candidates {
		if p.kind(ps, r, d, v) == notVictim {
			continue
		}
		if _, ok := saved[v.project]; !ok {
			saved[v.project] = slices.Clone(v.project.used)
		}
		victims = append(victims, v)
		v.project.take(v)
		if p.fitsWithout(ni, sh, append(slices.Clone(stopping), victims...)) {
			return victims, true
		}
	}
	return nil, false
}

// kind is whether v may be preempted for r, which needs dimension d
// most on v's node, and as what.
func (p *preemption) kind(ps *projectState, r *Run, d int, v *victim) victimKind {
	if v.project == ps {
		if v.Priority < r.Priority && !slices.Contains(v.PreemptedFor, "priority:"+ps.name) {
			return lowerPriority
		}
		return notVictim
	}
	if slices.Contains(v.PreemptedFor, "reclaim:"+ps.name) {
		return notVictim
	}
	share := 0.0
	switch d {
	case dimCPU:
		share = v.CPU
	case dimMem:
		share = float64(v.MemoryBytes)
	default:
		for _, vd := range v.gpuDims {
			if vd == d {
				share++
			}
		}
	}
	q := v.project
	if share <= 0 || ps.over(r, d) >= 0 || q.used[d]-share < q.quota[d]-1e-9 {
		return notVictim
	}
	return reclaim
}

// fitsWithout reports whether r's shape fits node ni once the attempts
// gone are gone. It frees them on the node's state, checks, and puts them
// back, so the index is as it was.
func (p *preemption) fitsWithout(ni int32, sh *shape, gone []*victim) bool {
	n := &p.t.x.nodes[ni]
	cpu, mem, used := n.freeCPU, n.freeMem, slices.Clone(n.used)
	for _, v := range gone {
		n.freeCPU += v.CPU
		n.freeMem += v.MemoryBytes
		for k, g := range n.gpus {
			if slices.Contains(v.GPUs, g.UUID) {
				n.used[k] = false
			}
		}
	}
	ok := p.t.x.check(ni, sh) == fits
	n.freeCPU, n.freeMem, n.used = cpu, mem, used
	return ok
}
