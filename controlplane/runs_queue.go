package controlplane

import (
	"errors"
	"net/http"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// noteQueue ranks the runs a pass left waiting (project.Queue) in the
// order the scheduler would take them (order, scheduler.Plan.Order),
// against when the running ones must end (schedcopy.Copy.Deadlines).
func (s *Server) noteQueue(waiting map[string]string, order []string, pending map[string]store.Run) {
	runs := make([]store.Run, 0, len(waiting))
	for id := range waiting {
		if r, ok := pending[id]; ok {
			runs = append(runs, r)
		}
	}
	s.queue.Rank(runs, order, s.sched.Deadlines())
}

// listQueue answers GET /v1/runs?queue=1: the queued runs of opts.Project
// (every project when empty) in scheduling order, at most opts.Limit, each
// with its position. Runs that left the queue since the pass are skipped.
func (s *Server) listQueue(w http.ResponseWriter, r *http.Request, opts store.ListRunsOptions) {
	ids := s.queue.Ordered(opts.Project)
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
