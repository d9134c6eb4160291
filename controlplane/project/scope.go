package project

import (
	"net/http"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// Tokens confined to projects (docs/teams.md): such a credential sees and
// touches only its projects' runs. Submission names (or defaults to) one
// of them (ScopeSubmit); the routes about one run check the run's project
// first (ScopeRun); a listing is of one of them (ScopeList). Package
// controlplane applies these rules.

// ScopeList confines a listing to the caller's projects: the one asked for
// if it is one of them, its only one if none was asked for.
func ScopeList(r *http.Request, opts *store.ListRunsOptions) error {
	scope := httpapi.ProjectScope(r.Context())
	switch {
	case scope == nil:
		return nil
	case opts.Project != "":
		return httpapi.ConfineToProject(r.Context(), opts.Project, "list runs")
	case len(scope) == 1:
		opts.Project = scope[0]
		return nil
	}
	return failure.Invalid("project", "this token is confined to several projects; name one with ?project= (`run ls --project`)")
}

// ScopeSubmit gives a spec without a project the caller's first project,
// and refuses one of another project.
func ScopeSubmit(r *http.Request, spec *api.RunSpec) error {
	if scope := httpapi.ProjectScope(r.Context()); scope != nil && spec.Project == "" {
		spec.Project = scope[0]
	}
	return httpapi.ConfineToProject(r.Context(), api.ProjectOf(spec.Project), "submit runs")
}

// ScopeRun wraps a route about run {id}: a caller confined to projects
// gets the route only for a run of one of them (action names what it was
// refused, in the error). The run is read from st only for such a caller;
// any other gets h as it is.
func ScopeRun(st store.Store, action string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if httpapi.ProjectScope(r.Context()) != nil {
			var run store.Run
			err := st.View(r.Context(), func(tx store.Tx) (err error) { run, err = tx.GetRun(r.PathValue("id")); return err })
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
