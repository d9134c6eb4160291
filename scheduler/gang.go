package scheduler

// Gang runs: a Run with Nodes > 1 asks for that many members, one per node,
// each the Run's shape, placed all at once or not at all. A partial gang
// would hold GPUs on some machines while it waits for the others, and a
// distributed job cannot start until every rank is up: that is how a
// fleet strands its GPUs.
//
// The members are placed by the single-run policy, one after another, each
// on the best node the others did not take: the index is asked N times,
// with each node chosen so far hidden (made to look full) until the answer
// is complete. Only then is anything committed; a gang that does not fit
// leaves the index as it found it, memos included, so the runs after it
// are placed exactly as if it had not been considered. Where the first N
// nodes found mix link readings, more are looked at and the N with the
// closest readings taken (linkmatch.go).

import (
	"fmt"

	"github.com/mercator/mercator/internal/bytesize"
)

// scheduleGang places gang run r (r.Nodes members of shape sh) in plan, or
// explains in plan why it waits.
//
// Capacity only shrinks during a call, so once a gang of a shape found only
// k nodes, no later gang of that shape needing more than k fits in this
// call: it is answered from that count without a search (its reason then
// says how many nodes fitted when the first such gang looked).
func (x *index) scheduleGang(r *Run, sh shape, plan *Plan) {
	key := sh.key()
	if k, ok := x.gangWaits[key]; ok && r.Nodes > k {
		plan.Waiting[r.ID] = gangText(r, sh, k)
		return
	}
	chosen := x.findGang(r, sh)
	if len(chosen) < r.Nodes {
		if x.gangWaits == nil {
			x.gangWaits = map[shapeKey]int{}
		}
		x.gangWaits[key] = len(chosen)
		plan.Waiting[r.ID] = gangText(r, sh, len(chosen))
		return
	}
	for rank, ni := range chosen {
		plan.Placements = append(plan.Placements, Placement{RunID: r.ID, NodeID: x.nodes[ni].node.ID, GPUs: x.commit(ni, r, sh), Rank: rank})
	}
}

// findGang returns up to r.Nodes distinct nodes for the members of r, in
// the order the policy prefers them, on matching links where the policy's
// first choice mixes them (linkmatch.go); fewer means only that many nodes
// can take a member now. The index is left as it was.
func (x *index) findGang(r *Run, sh shape) []int32 {
	key := sh.key()
	memo := x.memoFor(key)
	var chosen []int32
	saved := make([]nodeState, 0, r.Nodes)
	for len(chosen) < r.Nodes {
		ni := x.place(r, sh)
		if ni < 0 {
			break
		}
		chosen = append(chosen, ni)
		saved = append(saved, x.nodes[ni])
		x.hide(ni)
	}
	// Members on matching links (linkmatch.go): only when the policy's
	// first N mix readings are more fitting nodes looked at.
	if len(chosen) == r.Nodes && !x.linksMatch(chosen) {
		chosen, saved = x.hideMore(r, sh, r.Nodes, chosen, saved, linkCandidates(r.Nodes))
	}
	for i, ni := range chosen {
		x.restore(ni, saved[i])
	}
	x.restoreMemo(key, memo)
	return x.pickMatching(chosen, r.Nodes)
}

// hide makes node ni look full to every search, so the next member goes
// elsewhere.
func (x *index) hide(ni int32) {
	n := &x.nodes[ni]
	n.freeCPU, n.freeMem, n.free = -1, -1, 0
	for _, ref := range n.refs {
		ref.t.update(ref.leaf, n)
	}
}

// restore puts back the state hide replaced.
func (x *index) restore(ni int32, was nodeState) {
	n := &x.nodes[ni]
	n.freeCPU, n.freeMem, n.free = was.freeCPU, was.freeMem, was.free
	for _, ref := range n.refs {
		ref.t.update(ref.leaf, n)
	}
}

// gangMemo is which "fits nowhere" memos for one shape existed before a
// gang search: those the search adds were learnt with nodes hidden, and
// would wrongly turn later runs of the shape away.
type gangMemo struct {
	nowhere bool
	pools   map[*pool]bool
}

func (x *index) memoFor(key shapeKey) gangMemo {
	m := gangMemo{nowhere: x.nowhere[key] != nil, pools: map[*pool]bool{}}
	for _, p := range x.allPools() {
		if p.nowhere[key] {
			m.pools[p] = true
		}
	}
	return m
}

func (x *index) restoreMemo(key shapeKey, m gangMemo) {
	if !m.nowhere {
		delete(x.nowhere, key)
	}
	for _, p := range x.allPools() {
		if !m.pools[p] {
			delete(p.nowhere, key)
		}
	}
}

// allPools is the fleet and every image and Artifact pool built so far.
func (x *index) allPools() []*pool {
	out := []*pool{x.fleet}
	for _, p := range x.pools {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// gangText is why a gang waits: how many nodes it needs, what each must
// have free, and how many have it ("need 2 nodes with 8 free H100 GPUs; 1
// has").
func gangText(r *Run, sh shape, have int) string {
	what := fmt.Sprintf("room for %g CPUs and %s", sh.cpu, bytesize.Format(sh.mem))
	if sh.cpu == 0 && sh.mem == 0 {
		what = "room for a member" // asks for nothing: any node up, not yet taken
	}
	if sh.gpus > 0 {
		model := ""
		if r.GPUModel != "" {
			model = r.GPUModel + " "
		}
		what = fmt.Sprintf("%d free %sGPUs", sh.gpus, model)
		if sh.gpuMem > 0 {
			what += " of " + bytesize.Format(sh.gpuMem) + " or more"
		}
	}
	verb := "have"
	if have == 1 {
		verb = "has"
	}
	return fmt.Sprintf("waiting: gang of %d: need %d nodes with %s; %d %s", r.Nodes, r.Nodes, what, have, verb)
}
