package scheduler

// Gang runs while projects plan the fleet (docs/teams.md, docs/gpus.md): a
// gang is one run of its project, placed whole or not at all like any
// gang (gang.go), and charged as what all its members hold: its quota
// check (projectState.over, need) counts every member, and the fair-share
// passes take it as one run. In the guaranteed pass it is placed only if
// the whole gang stays within its project's quota; otherwise the borrowing
// pass places it on idle capacity anywhere, like any run over its quota.
// Nothing is preempted to make room for a gang (preempt.go): freeing
// several nodes at once for one run is where preemption loops start.

// tryGang places gang run i (shape sh) whole for project ps, if the fleet
// has room for every member and, in the guaranteed pass, the project's
// quota has room for all of them (the caller checked it in dimension gd,
// the run's GPU dimension; -2, a model only the nodes decide, is checked
// here against the nodes chosen). In the guaranteed pass a gang that does
// not fit is deferred to the borrowing pass, which says why it waits.
func (t *teams) tryGang(ps *projectState, i int32, sh shape, gd int, guaranteed bool) bool {
	r := &t.s.Pending[i]
	chosen := t.x.findGang(r, sh)
	fits := len(chosen) == r.Nodes
	if fits && guaranteed && gd == -2 && t.overOnNodes(ps, r, chosen, sh) {
		fits = false
	}
	if !fits {
		if guaranteed {
			ps.deferred = append(ps.deferred, i)
		}
		return false
	}
	t.commitMembers(ps, r, chosen, sh)
	return true
}

// overOnNodes reports whether a gang whose GPU model only its nodes decide
// (gd -2) would pass its project's quota of those nodes' GPUs placed on
// them.
func (t *teams) overOnNodes(ps *projectState, r *Run, nodes []int32, sh shape) bool {
	add := map[int]float64{}
	for _, ni := range nodes {
		add[t.nodeDim(ni, &sh)] += float64(r.GPUs)
	}
	for d, n := range add {
		if ps.used[d]+n > ps.quota[d]+1e-9 {
			return true
		}
	}
	return false
}
