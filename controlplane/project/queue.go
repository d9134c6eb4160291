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

// Rank replaces the ranking with the runs a pass left waiting. deadlines
// are the moments running work with a timeout must end by, earliest
// first: the k-th run of a project cannot start before the k-th of them.
func (q *Queue) Rank(waiting []store.Run, deadlines []time.Time) {
	byProject := map[string][]store.Run{}
	for _, r := range waiting {
		p := api.ProjectOf(r.Project)
		byProject[p] = append(byProject[p], r)
	}
	byRun := make(map[string]api.QueuePosition, len(waiting))
	order := make([]string, 0, len(waiting))
	projects := make([]string, 0, len(byProject))
	for p := range byProject {
		projects = append(projects, p)
	}
	slices.Sort(projects)
	for _, p := range projects {
		runs := byProject[p]
		slices.SortFunc(runs, func(a, b store.Run) int {
			return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
		})
		for i, r := range runs {
			pos := api.QueuePosition{Project: p, Position: i + 1, Of: len(runs)}
			for _, ahead := range runs[max(0, i-maxAhead):i] {
				pos.Ahead = append(pos.Ahead, ahead.ID)
			}
			if i < len(deadlines) {
				t := deadlines[i]
				pos.EarliestStart = &t
			}
			byRun[r.ID] = pos
			order = append(order, r.ID)
		}
	}
	q.mu.Lock()
	q.byRun, q.order = byRun, order
	q.mu.Unlock()
}
