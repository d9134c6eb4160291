package project

import (
	"net/http"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// Tokens confined to projects (docs/teams.md): these are the rules for
// listing and submitting runs; package controlplane applies them.

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
