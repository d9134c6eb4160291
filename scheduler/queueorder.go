package scheduler

// The queue's order across projects (docs/teams.md, `run ls --queue`): the
// order in which this call's passes would take the runs it left waiting,
// were there room for each. It is the scheduler's own order, computed by
// its own passes over its own state once the plan is made (guaranteed work
// of every project first, then borrowing work, each time from the project
// with the least weighted dominant share, a project's queue by priority
// and then submission), with "place" replaced by "charge the run to its
// project": so the next run is the one the next pass would place first
// should capacity appear, and the projects interleave as their shares
// say. Runs this plan preempts for come first, in the order it decided
// them: room is being made for them, and preemption already charged them
// to their projects. A run whose GPU model only its node decides is
// charged to the fleet's GPUs that no quota names.

// queueOrder is Plan.Order: the waiting runs of this call, in the order
// described above. It changes t's project states; call it last.
func (t *teams) queueOrder() []string {
	if len(t.plan.Waiting) == 0 {
		return nil
	}
	for _, ps := range t.projects {
		ps.queue, ps.deferred = ps.queue[:0], ps.deferred[:0]
	}
	order := make([]string, 0, len(t.plan.Waiting))
	first := map[string]bool{}
	for _, p := range t.plan.Preemptions {
		if !first[p.By] {
			first[p.By] = true
			order = append(order, p.By)
		}
	}
	for i := range t.s.Pending {
		r := &t.s.Pending[i]
		if _, waiting := t.plan.Waiting[r.ID]; waiting && !first[r.ID] {
			ps := t.project(r.Project)
			ps.queue = append(ps.queue, int32(i))
		}
	}
	take := func(ps *projectState, i int32) bool {
		r := &t.s.Pending[i]
		order = append(order, r.ID)
		ps.running++
		ps.used[dimCPU] += need(r, dimCPU)
		ps.used[dimMem] += need(r, dimMem)
		if d := t.runDim(r); d >= 0 {
			ps.used[d] += need(r, d)
		} else if d == -2 {
			ps.used[dimGPU0+len(t.words)] += need(r, d)
		}
		t.reshare(ps)
		return true
	}
	for _, ps := range t.projects {
		ps.queue = t.orderQueue(ps.queue)
	}
	t.pass(func(p *projectState) *[]int32 { return &p.queue }, func(ps *projectState, i int32) bool {
		r := &t.s.Pending[i]
		if ps.atCap() || ps.over(r, t.runDim(r)) >= 0 {
			ps.deferred = append(ps.deferred, i)
			return false
		}
		return take(ps, i)
	})
	t.pass(func(p *projectState) *[]int32 { return &p.deferred }, take)
	return order
}
