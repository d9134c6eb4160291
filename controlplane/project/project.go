// Package project holds the control plane's projects: a team's guaranteed
// quota, its weight in fair share and the pools its work may use
// (docs/teams.md). It stores and serves them, and holds the pure parts of
// planning by project that are the control plane's rather than the
// scheduler's: queue positions (queue.go), decayed shares (share.go), a
// project's pools as a run's constraints (pools.go), what a token
// confined to projects may list, read and submit (scope.go, and fnscope.go
// for the Functions routes), and what a project's function containers
// hold (functions.go).
//
// The default project always exists: reads show it with no quota until an
// operator updates it, and it cannot be removed, so a run that names no
// project always has one to count against.
//
// Only the control plane's packages import it: controlplane, and its
// access, artifact, registry and function packages, which check that a
// project exists and confine callers to theirs.
package project

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// Service serves the project routes. It is safe for concurrent use.
type Service struct {
	store store.Store
	now   func() time.Time
	log   *slog.Logger
	// nodes is the fleet's records as the control plane last read them
	// (ReadNodesWith), for a project's function reservations; nil shows
	// none.
	nodes func(ctx context.Context) ([]store.Node, error)
}

// ReadNodesWith has the service read the fleet's records through nodes
// (the control plane's cached list: never a read of every node per
// request), to show each project's function reservations by node.
func (s *Service) ReadNodesWith(nodes func(ctx context.Context) ([]store.Node, error)) {
	s.nodes = nodes
}

// New returns the project service; now is the clock (UTC).
func New(st store.Store, now func() time.Time, log *slog.Logger) *Service {
	return &Service{store: st, now: now, log: log}
}

// Routes are the public project routes, each served behind an API
// credential.
func (s *Service) Routes() []httpapi.Route {
	return []httpapi.Route{
		{Pattern: "POST /v1/projects", Handler: s.create},
		{Pattern: "GET /v1/projects", Handler: s.list},
		{Pattern: "GET /v1/projects/{name}", Handler: s.get},
		{Pattern: "PUT /v1/projects/{name}", Handler: s.update},
		{Pattern: "DELETE /v1/projects/{name}", Handler: s.remove},
	}
}

// defaultProject is the default project as shown before anyone stored it.
func defaultProject() store.Project {
	return store.Project{Project: api.Project{Name: api.DefaultProject}}
}

// List returns every project, the default one included, ordered by name.
func List(tx store.Tx) ([]store.Project, error) {
	ps, err := tx.ListProjects()
	if err != nil {
		return nil, err
	}
	for i, p := range ps {
		if p.Name == api.DefaultProject {
			return ps, nil
		}
		if p.Name > api.DefaultProject {
			return append(ps[:i], append([]store.Project{defaultProject()}, ps[i:]...)...), nil
		}
	}
	return append(ps, defaultProject()), nil
}

// Get returns one project, the default one even when it is not stored;
// failure.ErrNotFound names the project otherwise.
func Get(tx store.Tx, name string) (store.Project, error) {
	p, err := tx.GetProject(name)
	if errors.Is(err, failure.ErrNotFound) && name == api.DefaultProject {
		return defaultProject(), nil
	}
	if errors.Is(err, failure.ErrNotFound) {
		return p, &failure.Error{Kind: failure.ErrNotFound, Message: fmt.Sprintf("project %q not found: list projects with `mercator project ls`; an operator creates one with `mercator project create NAME`", name)}
	}
	return p, err
}

// Exists checks that a run or app may name the project: nil for an
// existing one, failure.ErrInvalid naming the field otherwise.
func Exists(tx store.Tx, field, name string) error {
	if _, err := Get(tx, api.ProjectOf(name)); errors.Is(err, failure.ErrNotFound) {
		return failure.Invalid(field, "project %q does not exist: create it with `mercator project create %s`, or leave it out for %q", name, name, api.DefaultProject)
	} else if err != nil {
		return err
	}
	return nil
}

// unscoped refuses a change of projects by a credential confined to some:
// it could raise its own quota.
func unscoped(r *http.Request) error {
	if httpapi.ProjectScope(r.Context()) != nil {
		return failure.Forbidden("a token confined to projects may not create, change or remove projects; use an operator token for every project")
	}
	return nil
}

func (s *Service) create(w http.ResponseWriter, r *http.Request) {
	if err := unscoped(r); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	var p api.Project
	if err := httpapi.Decode(r, httpapi.MaxBody, &p); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	p.FunctionReservations = nil // shown, never set
	if err := p.Validate(); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	now := s.now()
	p.CreatedAt, p.UpdatedAt = now, now
	err := s.store.Update(r.Context(), func(tx store.Tx) error {
		all, err := tx.ListProjects()
		if err != nil {
			return err
		}
		if len(all) >= api.MaxProjects {
			return failure.Invalid("name", "this control plane already has %d projects, its limit; remove one with `mercator project rm`", len(all))
		}
		if p.Name == api.DefaultProject {
			return failure.Conflict("project %q always exists; change it with `mercator project update default`", p.Name)
		}
		return tx.CreateProject(store.Project{Project: p})
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.log.Info("project created", "project", p.Name)
	httpapi.WriteJSON(w, http.StatusCreated, p)
}

func (s *Service) list(w http.ResponseWriter, r *http.Request) {
	out := api.ProjectList{Projects: []api.Project{}}
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		ps, err := List(tx)
		out.Projects = out.Projects[:0]
		for _, p := range ps {
			if httpapi.ConfineToProject(r.Context(), p.Name, "") == nil {
				out.Projects = append(out.Projects, p.Project)
			}
		}
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// get answers GET /v1/projects/{name}: the project, with its function
// reservations by node.
func (s *Service) get(w http.ResponseWriter, r *http.Request) {
	var p store.Project
	var nodes []store.Node
	err := httpapi.ConfineToProject(r.Context(), r.PathValue("name"), "read the project")
	if err == nil && s.nodes != nil {
		nodes, err = s.nodes(r.Context())
	}
	if err == nil {
		err = s.store.View(r.Context(), func(tx store.Tx) (err error) {
			if p, err = Get(tx, r.PathValue("name")); err != nil {
				return err
			}
			p.FunctionReservations, err = Reservations(tx, p.Name, nodes)
			return err
		})
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, p.Project)
}

// update replaces a project's quota, limits, weight and pools with the
// body's (a whole replacement, so the answer is exactly what is stored);
// the default project is stored on its first update.
func (s *Service) update(w http.ResponseWriter, r *http.Request) {
	if err := unscoped(r); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	var p api.Project
	if err := httpapi.Decode(r, httpapi.MaxBody, &p); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	p.FunctionReservations = nil // shown, never set
	name := r.PathValue("name")
	if p.Name == "" {
		p.Name = name
	}
	if p.Name != name {
		httpapi.WriteError(w, failure.Invalid("name", "the body names %q but the path %q; a project cannot be renamed", p.Name, name))
		return
	}
	if err := p.Validate(); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	err := s.store.Update(r.Context(), func(tx store.Tx) error {
		old, err := Get(tx, name)
		if err != nil {
			return err
		}
		p.CreatedAt, p.UpdatedAt = old.CreatedAt, s.now()
		if old.CreatedAt.IsZero() { // the default project, never stored
			p.CreatedAt = p.UpdatedAt
			return tx.CreateProject(store.Project{Project: p})
		}
		return tx.PutProject(store.Project{Project: p})
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.log.Info("project updated", "project", p.Name)
	httpapi.WriteJSON(w, http.StatusOK, p)
}

// remove deletes a project that has no unfinished runs: DELETE
// /v1/projects/{name}. Finished runs keep its name (their history).
func (s *Service) remove(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := unscoped(r); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if name == api.DefaultProject {
		httpapi.WriteError(w, failure.Invalid("name", "the default project cannot be removed: runs that name no project count against it"))
		return
	}
	var out store.Project
	err := s.store.Update(r.Context(), func(tx store.Tx) error {
		var err error
		if out, err = Get(tx, name); err != nil {
			return err
		}
		live, err := tx.ListRuns(store.ListRunsOptions{Project: name, Limit: 1,
			Statuses: []string{api.RunQueued, api.RunPlaced, api.RunPreparing, api.RunRunning}})
		if err != nil {
			return err
		}
		if len(live) > 0 {
			return failure.Conflict("project %q still has unfinished runs (%s, …): cancel them or wait for them to finish", name, live[0].ID)
		}
		return tx.DeleteProject(name)
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.log.Info("project removed", "project", name)
	httpapi.WriteJSON(w, http.StatusOK, out.Project)
}

// Load returns every project by name, the default one included, for the
// scheduler's snapshot.
func Load(ctx context.Context, st store.Store) (map[string]store.Project, error) {
	out := map[string]store.Project{}
	err := st.View(ctx, func(tx store.Tx) error {
		ps, err := List(tx)
		for _, p := range ps {
			out[p.Name] = p
		}
		return err
	})
	return out, err
}
