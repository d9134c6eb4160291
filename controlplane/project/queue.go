package project

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
)

// Queue positions (docs/teams.md): each reconcile pass, once its plan is
// made, ranks the runs left waiting in each project's queue in the order
// the scheduler considers them (priority, then submission), and keeps that
// for reads: `run get` shows a queued run's position and the runs just
// ahead, `run ls --queue` the queue in that order. Only the replica that
// plans has it; reads elsewhere show no position.

// maxAhead is how many runs ahead a position names.
const maxAhead = 3

// Queue is the last pass's ranking. The zero value is empty and ready;
// it is safe for concurrent use.
type Queue struct {
	mu    sync.Mutex
	byRun map[string]api.QueuePosition
	order []string // every waiting run: by project, then position
}

// Position is run id's place, if the last pass ranked it.
func (q *Queue) Position(id string) (api.QueuePosition, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	p, ok := q.byRun[id]
	return p, ok
}

// Ordered is the waiting runs of project (every project when "") in
// scheduling order.
func (q *Queue) Ordered(project string) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []string
	for _, id := range q.order {
		if project == "" || q.byRun[id].Project == project {
			out = append(out, id)
		}
	}
	return out
}

// Rank replaces the ranking with the runs a pass left waiting. order is
// the scheduler's order across projects (scheduler.Plan.Order, nil when it
// planned without projects): the waiting runs it names come first, in that
// order, and the others after them, by project, then priority, then
// submission (which is the scheduler's order within a project). A run's
// position is its place among its project's runs in that order.
// deadlines are the moments running work with a timeout must end by,
// earliest first: the k-th run of a project cannot start before the k-th
// of them.
func (q *Queue) Rank(waiting []store.Run, order []string, deadlines []time.Time) {
	byID := make(map[string]store.Run, len(waiting))
	for _, r := range waiting {
		byID[r.ID] = r
	}
	all := make([]store.Run, 0, len(waiting))
	taken := make(map[string]bool, len(order))
	for _, id := range order {
		if r, ok := byID[id]; ok && !taken[id] {
			taken[id] = true
			all = append(all, r)
		}
	}
	rest := make([]store.Run, 0, len(waiting)-len(all))
	for _, r := range waiting {
		if !taken[r.ID] {
			rest = append(rest, r)
		}
	}
	slices.SortFunc(rest, func(a, b store.Run) int {
		return cmp.Or(cmp.Compare(api.ProjectOf(a.Project), api.ProjectOf(b.Project)), cmp.Compare(b.Priority, a.Priority),
			a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	all = append(all, rest...)
	byProject := map[string][]string{}
	for _, r := range all {
		p := api.ProjectOf(r.Project)
		byProject[p] = append(byProject[p], r.ID)
	}
	byRun := make(map[string]api.QueuePosition, len(all))
	ids := make([]string, len(all))
	before := map[string]int{} // by project: its runs ranked so far
	for k, r := range all {
		ids[k] = r.ID
		p := api.ProjectOf(r.Project)
		mine, i := byProject[p], before[p]
		before[p]++
		pos := api.QueuePosition{Project: p, Position: i + 1, Of: len(mine), Ahead: slices.Clone(mine[max(0, i-maxAhead):i])}
		if len(pos.Ahead) == 0 {
			pos.Ahead = nil
		}
		if i < len(deadlines) {
			t := deadlines[i]
			pos.EarliestStart = &t
		}
		byRun[r.ID] = pos
	}
	q.mu.Lock()
	q.byRun, q.order = byRun, ids
	q.mu.Unlock()
}
