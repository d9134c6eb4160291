package controlplane

import (
	"cmp"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
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

// queueState is the last pass's ranking. Safe for concurrent use.
type queueState struct {
	mu    sync.Mutex
	byRun map[string]api.QueuePosition
	order []string // every waiting run: by project, then position
}

// position is run id's place, if the last pass ranked it.
func (q *queueState) position(id string) (api.QueuePosition, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	p, ok := q.byRun[id]
	return p, ok
}

// ordered is the waiting runs of project (every project when "") in
// scheduling order.
func (q *queueState) ordered(project string) []string {
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

// noteQueue ranks the runs a pass left waiting. deadlines are the moments
// running work with a timeout must end by, for the estimates.
func (s *Server) noteQueue(waiting map[string]string, pending map[string]store.Run) {
	byProject := map[string][]store.Run{}
	for id := range waiting {
		if r, ok := pending[id]; ok {
			p := api.ProjectOf(r.Project)
			byProject[p] = append(byProject[p], r)
		}
	}
	deadlines := s.runningDeadlines()
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
	s.queue.mu.Lock()
	s.queue.byRun, s.queue.order = byRun, order
	s.queue.mu.Unlock()
}

// runningDeadlines is when each running run with a timeout must end,
// earliest first.
func (s *Server) runningDeadlines() []time.Time {
	var out []time.Time
	s.sched.eachActive(func(_ string, u runUsage) {
		if !u.teams.deadline.IsZero() {
			out = append(out, u.teams.deadline)
		}
	})
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// listQueue answers GET /v1/runs?queue=1: the queued runs of opts.Project
// (every project when empty) in scheduling order, at most opts.Limit, each
// with its position. Runs that left the queue since the pass are skipped.
func (s *Server) listQueue(w http.ResponseWriter, r *http.Request, opts store.ListRunsOptions) {
	ids := s.queue.ordered(opts.Project)
	out := api.RunList{Runs: []api.Run{}}
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		for _, id := range ids {
			if len(out.Runs) == opts.Limit {
				break
			}
			run, err := tx.GetRun(id)
			if errors.Is(err, failure.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if run.Status == api.RunQueued {
				out.Runs = append(out.Runs, s.view(run, nil))
			}
		}
		return nil
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}
