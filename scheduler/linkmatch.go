package scheduler

// Gang members on matching links. A gang's members copy the same Artifacts
// (a dataset, a model's weights) and wait for each other at every step, so
// the slowest member's link sets the pace of all of them: one member on a
// node that copies at a tenth of the others' rate makes the whole gang
// start late. Among the nodes that fit a gang, the scheduler therefore
// prefers N whose link readings (Node.LinkFloorBPS, the measured
// artifact-copy floor; artifacts.go) are closest.
//
// How. findGang (gang.go) first asks the single-run policy for N nodes, as
// before. If their readings already match (the fastest at most
// linkMatchRatio times the slowest) that answer stands, so a fleet of
// like nodes, or one nobody measured, is placed exactly as without this
// file and at the same cost. Otherwise it goes on asking the policy for
// more fitting nodes, in the policy's order, until N of those it has match,
// or it has linkCandidates(N), or no more fit; then matchingLinks picks
// the N to use among them: sorted by reading, the window of N neighbours
// with the smallest fastest/slowest ratio, where every ratio up to
// linkMatchRatio counts as equal (readings jitter, and a pair of
// unmeasured nodes, which read exactly the assumed value, must not beat
// measured fast ones over a percent). Among equal windows the one the
// policy ranks higher overall (the smallest sum of policy positions) wins,
// then the one of slower readings (the lower start), so the choice is
// deterministic. The members keep the policy's order for their ranks.
//
// The bound on candidates keeps a gang's search proportional to its size
// rather than to the fleet's: at most c = linkCandidates(N) fitting nodes,
// each found by the index like any placement, each checked against the
// others in O(N + c), and one sort of c readings. Stopping at the first N
// that match keeps the common case (a fleet with plenty of like nodes) to
// a few more searches than N. A node that has measured nothing reads
// AssumedLinkBytesPerSecond, as for the floor.

import "sort"

// linkMatchRatio is how far apart two readings may be and still match:
// the fastest member's floor at most 1.25 times the slowest's.
const linkMatchRatio = 1.25

// linkCandidates is how many fitting nodes a gang of n members whose first
// choice mixes readings considers: 8 per member, at least 64.
func linkCandidates(n int) int { return max(8*n, 64) }

// linkFloor is node n's reading: its measured floor, or the fleet's
// assumption when it has none (the control plane fills that in; a zero
// here is the same thing said by a caller that did not).
func linkFloor(n *Node) int64 {
	if n.LinkFloorBPS <= 0 {
		return AssumedLinkBytesPerSecond
	}
	return n.LinkFloorBPS
}

// linksMatch reports whether the readings of nodes (indexes into x.nodes)
// are within linkMatchRatio of each other.
func (x *index) linksMatch(nodes []int32) bool {
	lo, hi := int64(0), int64(0)
	for i, ni := range nodes {
		f := linkFloor(x.nodes[ni].node)
		if i == 0 || f < lo {
			lo = f
		}
		if f > hi {
			hi = f
		}
	}
	return float64(hi) <= linkMatchRatio*float64(lo)
}

// hideMore goes on asking the policy for nodes fitting r, hiding each, until
// n of hidden match, or hidden holds limit nodes, or no more fit; saved
// gets each one's state before it was hidden, for findGang to restore.
func (x *index) hideMore(r *Run, sh shape, n int, hidden []int32, saved []nodeState, limit int) ([]int32, []nodeState) {
	x.linkProbe = true
	defer func() { x.linkProbe = false }()
	sorted := make([]int64, 0, limit)
	for _, ni := range hidden {
		sorted = insertFloor(sorted, linkFloor(x.nodes[ni].node))
	}
	for len(hidden) < limit {
		ni := x.place(r, sh)
		if ni < 0 {
			break
		}
		hidden = append(hidden, ni)
		saved = append(saved, x.nodes[ni])
		x.hide(ni)
		f := linkFloor(x.nodes[ni].node)
		sorted = insertFloor(sorted, f)
		if matchAround(sorted, f, n) {
			break
		}
	}
	return hidden, saved
}

// insertFloor inserts f into the ascending sorted.
func insertFloor(sorted []int64, f int64) []int64 {
	i := sort.Search(len(sorted), func(k int) bool { return sorted[k] >= f })
	sorted = append(sorted, 0)
	copy(sorted[i+1:], sorted[i:])
	sorted[i] = f
	return sorted
}

// matchAround reports whether n readings of the ascending sorted, f among
// them, are within linkMatchRatio of each other: whether a window of n
// neighbours holding f is.
func matchAround(sorted []int64, f int64, n int) bool {
	i := sort.Search(len(sorted), func(k int) bool { return sorted[k] >= f })
	for start := max(0, i-n+1); start <= i && start+n <= len(sorted); start++ {
		if float64(sorted[start+n-1]) <= linkMatchRatio*float64(sorted[start]) {
			return true
		}
	}
	return false
}

// pickMatching returns the n of candidates (in the policy's order) that
// matchingLinks chooses, in the policy's order.
func (x *index) pickMatching(candidates []int32, n int) []int32 {
	if len(candidates) <= n {
		return candidates
	}
	floors := make([]int64, len(candidates))
	for i, ni := range candidates {
		floors[i] = linkFloor(x.nodes[ni].node)
	}
	out := make([]int32, 0, n)
	for _, pos := range matchingLinks(floors, n) {
		out = append(out, candidates[pos])
	}
	return out
}

// matchingLinks chooses n of the candidates whose readings are floors, given
// in the policy's order (position 0 is its first choice), and returns their
// positions in ascending order. It needs len(floors) >= n >= 1. See the
// file comment for the rule.
func matchingLinks(floors []int64, n int) []int {
	byFloor := make([]int, len(floors))
	for i := range byFloor {
		byFloor[i] = i
	}
	sort.Slice(byFloor, func(a, b int) bool {
		fa, fb := floors[byFloor[a]], floors[byFloor[b]]
		return fa < fb || fa == fb && byFloor[a] < byFloor[b]
	})
	best, bestScore, bestSum := 0, 0.0, 0
	sum := 0
	for i, pos := range byFloor {
		sum += pos
		if i < n-1 {
			continue
		}
		start := i - n + 1
		if start > 0 {
			sum -= byFloor[start-1]
		}
		score := max(float64(floors[pos])/float64(floors[byFloor[start]]), linkMatchRatio)
		if start == 0 || score < bestScore || score == bestScore && sum < bestSum {
			best, bestScore, bestSum = start, score, sum
		}
	}
	out := append([]int(nil), byFloor[best:best+n]...)
	sort.Ints(out)
	return out
}
