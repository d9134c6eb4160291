package project

import (
	"net/http"
	"slices"

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

// Artifacts, registry credentials and apps belong to a project as runs do
// (docs/teams.md), and a confined caller is held to its projects the same
// way: a listing shows only theirs (Filter), and a route about one object
// of another project is refused as a run's is (Confine, 403 naming the
// token and the project). Packages artifact, registry and function apply
// these.

// Named is the project a request about a project-scoped object means:
// named when the request names one (?project= or a body's field), else the
// caller's first project when it is confined, else the default project.
// It is refused (403) when it is not one of a confined caller's, action
// saying what was refused.
func Named(r *http.Request, named, action string) (string, error) {
	if named == "" {
		if scope := httpapi.ProjectScope(r.Context()); scope != nil {
			named = scope[0]
		}
	}
	named = api.ProjectOf(named)
	return named, httpapi.ConfineToProject(r.Context(), named, action)
}

// Confine refuses action on an object of project (stored "" is the
// default project) to a caller confined to other projects.
func Confine(r *http.Request, project, action string) error {
	return httpapi.ConfineToProject(r.Context(), api.ProjectOf(project), action)
}

// Filter is a listing's test of each object's project: the one ?project=
// names, when it does (refused, 403, when a confined caller may not see
// it), and otherwise every project the caller may see.
func Filter(r *http.Request, action string) (keep func(project string) bool, err error) {
	if named := r.URL.Query().Get("project"); named != "" {
		if err := httpapi.ConfineToProject(r.Context(), named, action); err != nil {
			return nil, err
		}
		return func(p string) bool { return api.ProjectOf(p) == named }, nil
	}
	scope := httpapi.ProjectScope(r.Context())
	return func(p string) bool { return scope == nil || slices.Contains(scope, api.ProjectOf(p)) }, nil
}

// InPools says whether a node with these labels is in one of pools (a
// project restricted to none may use every node): what the session stream
// checks before it attaches a run's registry credential or secrets to a
// launch, as a defence behind the scheduler, which places such a run only
// there (Constraints).
func InPools(labels map[string]string, pools []string) bool {
	return len(pools) == 0 || slices.Contains(pools, labels[PoolLabel])
}
