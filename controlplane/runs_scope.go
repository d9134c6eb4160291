package controlplane

import (
	"net/http"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/store"
)

// Tokens confined to projects (docs/teams.md): such a credential sees and
// touches only its projects' runs. Submission names (or defaults to) one
// of them (project.ScopeSubmit); the routes about one run check the run's
// project first (confinedRun); a listing is of one of them
// (project.ScopeList).

// confinedRun wraps a route about run {id}: a caller confined to projects
// gets the route only for a run of one of them.
func (s *Server) confinedRun(action string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if httpapi.ProjectScope(r.Context()) != nil {
			var run store.Run
			err := s.store.View(r.Context(), func(tx store.Tx) (err error) { run, err = tx.GetRun(r.PathValue("id")); return err })
			if err == nil {
				err = httpapi.ConfineToProject(r.Context(), api.ProjectOf(run.Project), action)
			}
			if err != nil {
				httpapi.WriteError(w, err)
				return
			}
		}
		h(w, r)
	}
}
