package scheduler

// This file is how Schedule answers "where does this run go" without asking
// every node. It changes no decision: every answer it gives is the one the
// policy gives when each node is checked in turn (the package doc), and the
// equivalence property test holds it to that against the original
// one-pass-per-run implementation kept in reference_test.go. What it changes
// is the cost, because a control plane re-plans its whole queue many times a
// minute and a fleet of ten thousand machines with a hundred thousand queued
// runs made that a billion node checks.
//
// The index, built once per call:
//
//   - Nodes that are not ready, cordoned or without facts cannot take
//     anything, whatever the run; they are counted once for every waiting
//     reason and never searched.
//   - The rest are grouped into pools: the whole fleet, and, on first use,
//     the nodes holding one image (preference 1 of the policy is "a node
//     holding the image", so the search asks that pool first and the fleet
//     only when no holder fits).
//   - In each pool, each node is a leaf of segment trees ordered by node ID,
//     whose inner entries hold the most free CPU and memory below them and
//     which free-GPU counts occur below them (a bit mask). One tree holds
//     the whole pool, for CPU runs; one per GPU signature (the multiset of
//     model and memory of a node's GPUs, so 8×H100 machines share one),
//     for GPU runs, so a run asking for H100s never visits an A100 machine.
//   - A search descends only where the maxima say a node could fit, and
//     checks the full predicates at the leaf, so pruning never loses a node
//     that fits. CPU runs take the most free memory (branch and bound, larger
//     child first); GPU runs take the fewest free GPUs that still fit, by
//     trying free counts upwards and taking the lowest ID at the first count
//     that has any node that fits: the search stops as soon as the best
//     possible score is found.
//   - Free capacity only decreases during a call, so a run shape that fits
//     nowhere fits nowhere for the rest of the call: it is remembered, and
//     later runs of the same shape are answered without a search. The same
//     holds per image pool.
//   - A waiting reason counts every node's rejection at the moment the run
//     is considered. It is computed in full once per shape that waits, then
//     kept current by re-checking only the nodes that received a placement
//     since, so every waiting run gets the exact counts the one-pass scan
//     would have given it.

import (
	"math"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// shape is the part of a Run that decides where it fits and why it does
// not: everything the predicates read, and nothing else (not the ID, not
// the image, which only orders nodes that fit). Two runs of one shape are
// rejected by the same nodes for the same reasons at the same moment.
type shape struct {
	cpu    float64
	mem    int64
	gpus   int    // 0 for a CPU run
	model  string // lowercased GPUModel; "" means any
	gpuMem int64
	// minRead is the run's artifact-copy floor (Run.MinReadBPS; artifacts.go).
	minRead int64
	// minVersion is the agent capability version the run needs.
	minVersion int
	// labels is the run's constraints, canonical ("" for none; labels.go).
	labels string
}

// shapeKey is a shape as a map key: the CPU figure by its bits, so a NaN is
// one key rather than a new one every time.
type shapeKey struct {
	cpu        uint64
	mem        int64
	gpus       int
	model      string
	gpuMem     int64
	minRead    int64
	minVersion int
	labels     string
}

func shapeOf(r *Run) shape {
	return shape{cpu: r.CPU, mem: r.MemoryBytes, gpus: max(r.GPUs, 0), model: strings.ToLower(r.GPUModel), gpuMem: r.GPUMemory,
		minRead: max(r.MinReadBPS, 0), minVersion: r.MinAgentVersion, labels: canonicalConstraints(r.Constraints)}
}

func (sh *shape) key() shapeKey {
	return shapeKey{cpu: math.Float64bits(sh.cpu), mem: sh.mem, gpus: sh.gpus, model: sh.model, gpuMem: sh.gpuMem, minRead: sh.minRead, minVersion: sh.minVersion, labels: sh.labels}
}

// nodeState is one node during one call: the snapshot's node, read only,
// and what this call has placed on it so far.
type nodeState struct {
	node *Node
	// rank is the node's position ordered by ID, then by its position in
	// the snapshot: the policy's last tie-breaker, and the first node wins a
	// tie on both, as it did when nodes were scanned in order.
	rank int32
	// static is why the node can take nothing at all (not ready, cordoned,
	// no facts), or fits; staticText is that reason's text.
	static     rejection
	staticText string
	freeCPU    float64
	freeMem    int64
	gpus       []GPU    // the GPUs that may be placed on (placeable)
	models     []string // lowercased model of each GPU slot
	used       []bool   // whether each GPU slot is held
	free       int      // GPU slots not held
	sig        int32    // GPU signature
	refs       []leafRef
}

// leafRef is one tree leaf that stands for a node, to update when the node
// receives a placement.
type leafRef struct {
	t    *tree
	leaf int
}

// pool is a set of eligible nodes searched together.
type pool struct {
	all     *tree     // every member, for CPU runs
	bySig   []sigTree // members by GPU signature, for GPU runs
	nowhere map[shapeKey]bool
}

type sigTree struct {
	sig int32
	t   *tree
}

// signature is the GPUs of the nodes that share it, as the predicates read
// them.
type signature struct {
	models []string // lowercased
	mems   []int64
}

type matchKey struct {
	sig    int32
	model  string
	gpuMem int64
}

// waiting is what is known about one shape that fits nowhere: every node's
// rejection as of changes[pos], and the counts and text that follow.
type waiting struct {
	why    []rejection // by node index; eligible nodes only
	counts [rejections]int
	pos    int
	text   string // valid while fresh
	fresh  bool
}

// index is one call's view of the fleet. It is not safe for concurrent use;
// each call builds its own.
type index struct {
	nodes        []nodeState
	eligible     []int32 // in rank order
	staticCounts map[string]int
	sigs         []signature
	matches      map[matchKey]int
	fleet        *pool
	holders      map[string][]int32 // image → eligible nodes holding it, in rank order
	pools        map[string]*pool
	nowhere      map[shapeKey]*waiting
	changes      []int32          // nodes placed on, in order
	cands        []*tree          // scratch for one GPU search
	gangWaits    map[shapeKey]int // gang.go
	// linkProbe is set while linkmatch.go looks past a gang's first N
	// nodes: a miss then is the end of the candidates, not a reason.
	linkProbe bool
	// Constraints (labels.go): parsed by canonical form, and the pool of
	// eligible nodes matching each, built on first use.
	constraints map[string]map[string][]string
	labelPools  map[string]*pool
}

func newIndex(nodes []Node) *index {
	x := &index{
		nodes:        make([]nodeState, len(nodes)),
		staticCounts: map[string]int{},
		matches:      map[matchKey]int{},
		holders:      map[string][]int32{},
		pools:        map[string]*pool{},
		nowhere:      map[shapeKey]*waiting{},
	}
	order := make([]int32, len(nodes))
	for i := range order {
		order[i] = int32(i)
	}
	sort.SliceStable(order, func(a, b int) bool { return nodes[order[a]].ID < nodes[order[b]].ID })

	sigIDs := map[string]int32{}
	for rank, i := range order {
		n := &nodes[i]
		ns := &x.nodes[i]
		ns.node, ns.rank = n, int32(rank)
		ns.freeCPU, ns.freeMem = n.CPU-n.UsedCPU, n.MemoryBytes-n.UsedMemory
		switch {
		case !n.Ready:
			ns.static, ns.staticText = notReady, n.NotReadyReason
			if ns.staticText == "" {
				ns.staticText = notReady.text(shape{})
			}
		case n.Cordoned:
			ns.static, ns.staticText = cordoned, cordoned.text(shape{})
		case n.CPU == 0 || n.MemoryBytes == 0:
			ns.static, ns.staticText = noFacts, noFacts.text(shape{})
		}
		if ns.static != fits {
			x.staticCounts[ns.staticText]++
			continue
		}
		ns.gpus = placeable(n.GPUs)
		ns.models = make([]string, len(ns.gpus))
		ns.used = make([]bool, len(ns.gpus))
		for k, g := range ns.gpus {
			ns.models[k] = strings.ToLower(g.Model)
			ns.used[k] = n.UsedGPUs[g.UUID]
			if !ns.used[k] {
				ns.free++
			}
		}
		key := signatureKey(ns.gpus)
		sig, ok := sigIDs[key]
		if !ok {
			sig = int32(len(x.sigs))
			sigIDs[key] = sig
			s := signature{models: ns.models, mems: make([]int64, len(ns.gpus))}
			for k, g := range ns.gpus {
				s.mems[k] = g.MemoryBytes
			}
			x.sigs = append(x.sigs, s)
		}
		ns.sig = sig
		x.eligible = append(x.eligible, int32(i))
		for image, held := range n.Images {
			if held {
				x.holders[image] = append(x.holders[image], int32(i))
			}
		}
	}
	x.fleet = x.newPool(x.eligible)
	return x
}

// placeable is the GPUs of a node that may be placed on: gpus less the
// withheld ones (disputed, quarantined) and any UUID listed again (see GPU). It returns gpus itself
// when nothing is left out, as is usual.
func placeable(gpus []GPU) []GPU {
	clean := true
	for k, g := range gpus {
		if g.withheld() || (k > 0 && slices.ContainsFunc(gpus[:k], func(o GPU) bool { return o.UUID == g.UUID })) {
			clean = false
			break
		}
	}
	if clean {
		return gpus
	}
	out := make([]GPU, 0, len(gpus))
	listed := map[string]bool{}
	for _, g := range gpus {
		if !g.withheld() && !listed[g.UUID] {
			out = append(out, g)
		}
		listed[g.UUID] = true
	}
	return out
}

// signatureKey names a node's GPUs as a multiset of model and memory.
func signatureKey(gpus []GPU) string {
	if len(gpus) == 0 {
		return ""
	}
	parts := make([]string, len(gpus))
	for k, g := range gpus {
		parts[k] = g.Model + "\x00" + strconv.FormatInt(g.MemoryBytes, 10)
	}
	sort.Strings(parts)
	return strings.Join(parts, "\x01")
}

// newPool indexes members, which are eligible and in rank order.
func (x *index) newPool(members []int32) *pool {
	p := &pool{all: x.newTree(members), nowhere: map[shapeKey]bool{}}
	bySig := map[int32][]int32{}
	var sigs []int32
	for _, ni := range members {
		sig := x.nodes[ni].sig
		if bySig[sig] == nil {
			sigs = append(sigs, sig)
		}
		bySig[sig] = append(bySig[sig], ni)
	}
	for _, sig := range sigs {
		if len(x.sigs[sig].models) > 0 {
			p.bySig = append(p.bySig, sigTree{sig: sig, t: x.newTree(bySig[sig])})
		}
	}
	return p
}

// imagePool is the pool of nodes holding image, built on first use.
func (x *index) imagePool(image string) *pool {
	p := x.pools[image]
	if p == nil {
		p = x.newPool(x.holders[image])
		x.pools[image] = p
	}
	return p
}

// place returns the node the policy puts a run of this shape on, or -1.
func (x *index) place(r *Run, sh shape) int32 {
	key := sh.key()
	if x.nowhere[key] != nil {
		return -1
	}
	if sh.labels != "" {
		return x.placeConstrained(r, sh, key) // labels.go
	}
	if n := x.placeOnArtifactHolders(r, &sh, key); n >= 0 {
		return n
	}
	if len(x.holders[r.Image]) > 0 {
		p := x.imagePool(r.Image)
		if !p.nowhere[key] {
			if n := x.search(p, &sh); n >= 0 {
				return n
			}
			p.nowhere[key] = true
		}
	}
	if n := x.search(x.fleet, &sh); n >= 0 {
		return n
	}
	x.nowhere[key] = x.newWaiting(&sh)
	return -1
}

func (x *index) search(p *pool, sh *shape) int32 {
	if sh.gpus > 0 {
		return x.fewestFreeGPUs(p, sh)
	}
	best := int32(-1)
	x.roomiest(p.all, 1, 0, p.all.size, sh, &best)
	return best
}

// commit records a placement of r on node ni and returns the GPUs it gets:
// the free matching ones, lowest UUIDs first.
func (x *index) commit(ni int32, r *Run, sh shape) []string {
	n := &x.nodes[ni]
	var gpus []string
	if sh.gpus > 0 {
		free := make([]string, 0, n.free)
		for k, g := range n.gpus {
			if !n.used[k] && matches(n.models[k], g.MemoryBytes, &sh) {
				free = append(free, g.UUID)
			}
		}
		sort.Strings(free)
		gpus = free[:sh.gpus:sh.gpus]
		for _, uuid := range gpus {
			for k, g := range n.gpus {
				if g.UUID == uuid {
					n.used[k] = true
				}
			}
		}
		n.free = 0
		for _, used := range n.used {
			if !used {
				n.free++
			}
		}
	}
	n.freeCPU -= r.CPU
	n.freeMem -= r.MemoryBytes
	for _, ref := range n.refs {
		ref.t.update(ref.leaf, n)
	}
	x.changes = append(x.changes, ni)
	return gpus
}

func matches(model string, memory int64, sh *shape) bool {
	return (sh.model == "" || strings.Contains(model, sh.model)) && (sh.gpuMem <= 0 || memory >= sh.gpuMem)
}

// check is the policy's feasibility predicates for one node and one run, in
// their order: fits, or the first that fails.
func (x *index) check(ni int32, sh *shape) rejection {
	n := &x.nodes[ni]
	if n.static != fits {
		return n.static
	}
	switch {
	case sh.labels != "" && !x.labelsMatch(ni, sh.labels):
		return missingLabel
	case sh.minVersion > max(n.node.AgentVersion, 1):
		return olderAgent
	case belowLinkFloor(n.node, sh):
		return belowFloor
	case sh.cpu > n.node.CPU:
		return fewerCPUs
	case sh.mem > n.node.MemoryBytes:
		return lessMemory
	case sh.cpu > n.freeCPU+1e-9:
		return freeCPU
	case sh.mem > n.freeMem:
		return freeMemory
	case sh.gpus == 0:
		return fits
	}
	matching, free := 0, 0
	for k, g := range n.gpus {
		if matches(n.models[k], g.MemoryBytes, sh) {
			matching++
			if !n.used[k] {
				free++
			}
		}
	}
	switch {
	case matching < sh.gpus:
		return fewerMatchingGPUs
	case free < sh.gpus:
		return freeGPUs
	}
	return fits
}

// matching is how many GPUs of a signature a shape's filter accepts.
func (x *index) matching(sig int32, sh *shape) int {
	key := matchKey{sig: sig, model: sh.model, gpuMem: sh.gpuMem}
	count, ok := x.matches[key]
	if !ok {
		s := &x.sigs[sig]
		for k := range s.models {
			if matches(s.models[k], s.mems[k], sh) {
				count++
			}
		}
		x.matches[key] = count
	}
	return count
}

// fewestFreeGPUs is the GPU policy: the node with the fewest free GPUs that
// still fits, lowest rank among those. Free counts are tried upwards, and the
// first count at which any node fits ends the search.
func (x *index) fewestFreeGPUs(p *pool, sh *shape) int32 {
	cands := x.cands[:0]
	var present uint64
	for _, st := range p.bySig {
		if x.matching(st.sig, sh) >= sh.gpus {
			cands = append(cands, st.t)
			present |= st.t.mask[1]
		}
	}
	x.cands = cands
	present &= ^uint64(0) << min(sh.gpus, maxCountBit)
	for present != 0 {
		f := bits.TrailingZeros64(present)
		present &= present - 1
		best := int32(-1)
		for _, t := range cands {
			if f == maxCountBit {
				x.fewestAmongMany(t, 1, 0, t.size, sh, &best)
				continue
			}
			bound := int32(math.MaxInt32)
			if best >= 0 {
				bound = x.nodes[best].rank
			}
			if n := x.leftmost(t, 1, 0, t.size, uint(f), sh, bound); n >= 0 {
				best = n
			}
		}
		if best >= 0 {
			return best
		}
	}
	return -1
}

// prune reports whether no leaf under entry i of t can take the run: all
// padding, or too little free CPU or memory at best. It is conservative: the
// comparisons are the predicates' own, applied to the maxima.
func (x *index) prune(t *tree, i, lo int, sh *shape) bool {
	return t.member[lo] < 0 || sh.cpu > t.cpu[i]+1e-9 || sh.mem > t.mem[i]
}

// leftmost is the lowest-ranked node under entry i (covering leaves lo to
// lo+width) with exactly f free GPUs that takes the run, ranked before
// bound; -1 if none.
func (x *index) leftmost(t *tree, i, lo, width int, f uint, sh *shape, bound int32) int32 {
	if t.mask[i]&(1<<f) == 0 || x.prune(t, i, lo, sh) || x.nodes[t.member[lo]].rank >= bound {
		return -1
	}
	if i >= t.size {
		if ni := t.member[lo]; x.check(ni, sh) == fits {
			return ni
		}
		return -1
	}
	half := width / 2
	if n := x.leftmost(t, 2*i, lo, half, f, sh, bound); n >= 0 {
		return n
	}
	return x.leftmost(t, 2*i+1, lo+half, half, f, sh, bound)
}

// fewestAmongMany is leftmost for nodes with maxCountBit or more free GPUs,
// where one mask bit stands for many counts: it visits every such node that
// could fit and keeps the fewest free, then the lowest rank.
func (x *index) fewestAmongMany(t *tree, i, lo, width int, sh *shape, best *int32) {
	if t.mask[i]&(1<<maxCountBit) == 0 || x.prune(t, i, lo, sh) {
		return
	}
	if i >= t.size {
		ni := t.member[lo]
		if x.check(ni, sh) != fits {
			return
		}
		if *best < 0 {
			*best = ni
			return
		}
		n, b := &x.nodes[ni], &x.nodes[*best]
		if n.free < b.free || n.free == b.free && n.rank < b.rank {
			*best = ni
		}
		return
	}
	half := width / 2
	x.fewestAmongMany(t, 2*i, lo, half, sh, best)
	x.fewestAmongMany(t, 2*i+1, lo+half, half, sh, best)
}

// roomiest is the CPU policy: the node with the most free memory that takes
// the run, lowest rank among those. It is branch and bound: the child with
// more free memory below it first, and no subtree whose best cannot beat
// the best found.
func (x *index) roomiest(t *tree, i, lo, width int, sh *shape, best *int32) {
	if x.prune(t, i, lo, sh) {
		return
	}
	if *best >= 0 {
		b := &x.nodes[*best]
		if t.mem[i] < b.freeMem || t.mem[i] == b.freeMem && x.nodes[t.member[lo]].rank > b.rank {
			return
		}
	}
	if i >= t.size {
		ni := t.member[lo]
		if x.check(ni, sh) != fits {
			return
		}
		if *best < 0 {
			*best = ni
			return
		}
		n, b := &x.nodes[ni], &x.nodes[*best]
		if n.freeMem > b.freeMem || n.freeMem == b.freeMem && n.rank < b.rank {
			*best = ni
		}
		return
	}
	half := width / 2
	if t.mem[2*i+1] > t.mem[2*i] {
		x.roomiest(t, 2*i+1, lo+half, half, sh, best)
		x.roomiest(t, 2*i, lo, half, sh, best)
		return
	}
	x.roomiest(t, 2*i, lo, half, sh, best)
	x.roomiest(t, 2*i+1, lo+half, half, sh, best)
}

// newWaiting checks every eligible node against a shape that fits nowhere.
// While linkmatch.go probes (linkProbe) it checks nothing and returns nil,
// which reads as no memo: that miss only ends the probe's candidates and
// the memo would be dropped at once, so on a fleet where few nodes fit,
// checking every node for it would cost O(fleet) per gang.
func (x *index) newWaiting(sh *shape) *waiting {
	if x.linkProbe {
		return nil
	}
	w := &waiting{why: make([]rejection, len(x.nodes)), pos: len(x.changes)}
	for _, ni := range x.eligible {
		why := x.check(ni, sh)
		w.why[ni] = why
		w.counts[why]++
	}
	return w
}

// explain is the waiting reason of a run of this shape now: the rejections
// brought up to date by re-checking the nodes placed on since they were
// last counted, then written out (and kept, until a count changes).
func (x *index) explain(sh shape) string {
	w := x.nowhere[sh.key()]
	for _, ni := range x.changes[w.pos:] {
		if why := x.check(ni, &sh); why != w.why[ni] {
			w.counts[w.why[ni]]--
			w.counts[why]++
			w.why[ni] = why
			w.fresh = false
		}
	}
	w.pos = len(x.changes)
	if !w.fresh || w.text == "" {
		counts := make(map[string]int, len(x.staticCounts)+int(rejections))
		for text, n := range x.staticCounts {
			counts[text] += n
		}
		for why := fits + 1; why < rejections; why++ {
			if w.counts[why] > 0 {
				counts[why.text(sh)] += w.counts[why]
			}
		}
		w.text, w.fresh = explain(len(x.nodes), counts), true
	}
	return w.text
}

// maxCountBit is the mask bit that stands for this many free GPUs or more.
const maxCountBit = 63

// tree is a segment tree over a pool's nodes in rank order. Entry 1 is the
// root, entries size to 2*size-1 the leaves; each inner entry holds the most
// free CPU and memory below it and a mask with bit f set when a node below
// has f free GPUs (bit maxCountBit: that many or more). Padding leaves hold
// nothing and member -1, and only ever follow the real ones.
type tree struct {
	size   int
	member []int32
	cpu    []float64
	mem    []int64
	mask   []uint64
}

func (x *index) newTree(members []int32) *tree {
	size := 1
	for size < len(members) {
		size <<= 1
	}
	t := &tree{size: size, member: make([]int32, size), cpu: make([]float64, 2*size), mem: make([]int64, 2*size), mask: make([]uint64, 2*size)}
	for leaf := range t.member {
		t.member[leaf] = -1
		t.cpu[size+leaf], t.mem[size+leaf] = math.Inf(-1), math.MinInt64
	}
	for leaf, ni := range members {
		t.member[leaf] = ni
		t.setLeaf(leaf, &x.nodes[ni])
		x.nodes[ni].refs = append(x.nodes[ni].refs, leafRef{t: t, leaf: leaf})
	}
	for i := size - 1; i >= 1; i-- {
		t.pull(i)
	}
	return t
}

func (t *tree) setLeaf(leaf int, n *nodeState) {
	i := t.size + leaf
	t.cpu[i], t.mem[i], t.mask[i] = n.freeCPU, n.freeMem, 1<<min(n.free, maxCountBit)
}

func (t *tree) pull(i int) {
	l, r := 2*i, 2*i+1
	t.cpu[i] = maxCPU(t.cpu[l], t.cpu[r])
	t.mem[i] = max(t.mem[l], t.mem[r])
	t.mask[i] = t.mask[l] | t.mask[r]
}

func (t *tree) update(leaf int, n *nodeState) {
	t.setLeaf(leaf, n)
	for i := (t.size + leaf) / 2; i >= 1; i /= 2 {
		t.pull(i)
	}
}

// maxCPU is the larger figure, a NaN counting as infinite: a node whose free
// CPU is not a number fails no CPU predicate, so no bound may exclude it.
func maxCPU(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.Inf(1)
	}
	return max(a, b)
}
