package function

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"slices"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// notFoundAs maps a store's not-found to Fn's message for it.
func notFoundAs(err, as error) error {
	if errors.Is(err, failure.ErrNotFound) {
		return as
	}
	return err
}

// Apps.

func validateAppName(name string) error {
	switch {
	case name == "":
		return errFnMissingName
	case len(name) > api.MaxFnNameLength:
		return errFnAppTooLongName
	case !validName(name):
		return errFnAppInvalidName
	}
	return nil
}

func (s *Service) fnCreateApp(w http.ResponseWriter, r *http.Request) {
	var in api.App
	if err := decodeFn(r, &in); err != nil {
		s.fnFail(w, err)
		return
	}
	if in.ID != "" {
		s.fnFail(w, errFnAppIDProvided)
		return
	}
	if err := validateAppName(in.Name); err != nil {
		s.fnFail(w, err)
		return
	}
	if in.Shape != "" && !slices.Contains(api.AppShapes, in.Shape) {
		s.fnFail(w, errFnAppInvalidShape)
		return
	}
	proj, err := project.Named(r, in.Project, "create apps") // teams: the caller's project when it names none
	if err != nil {
		s.fnFail(w, err)
		return
	}
	in.Project = proj
	ann, err := compactAnnotations(in.Annotations, false)
	if err == nil {
		ann, err = mergeAnnotations(nil, ann)
	}
	if err != nil {
		s.fnFail(w, err)
		return
	}
	if err := validSyslogURL(in.SyslogURL); err != nil {
		s.fnFail(w, err)
		return
	}
	if in.SyslogURL != nil && *in.SyslogURL == "" {
		in.SyslogURL = nil
	}
	config, err := mergeConfig(nil, in.Config)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	id := httpapi.NewID("app-")
	sealed, err := s.mergeSecrets(secretOwner{"app", id}, nil, nil, in.SecretConfig)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	now := fnTime(s.now())
	app := store.App{App: api.App{ID: id, Name: in.Name, Config: config, Annotations: ann,
		SyslogURL: in.SyslogURL, Shape: in.Shape, CreatedAt: now, UpdatedAt: now, Project: in.Project}, SealedConfig: sealed}
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		if _, err := tx.GetAppByName(app.Name); err == nil {
			return errFnAppExists
		}
		if err := project.Exists(tx, "project", app.Project); err != nil {
			return err
		}
		err := tx.CreateApp(app)
		if errors.Is(err, failure.ErrConflict) {
			return errFnAppExists
		}
		return err
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	notePublicChange(r.Context(), "app "+app.Name, false, appPublic(app.Annotations))
	writeFnJSON(w, http.StatusOK, s.appView(app))
}

func (s *Service) fnGetApp(w http.ResponseWriter, r *http.Request) {
	var app store.App
	err := s.store.View(r.Context(), func(tx store.Tx) (err error) {
		app, err = tx.GetApp(r.PathValue("app_id"))
		return notFoundAs(err, errFnAppNotFound)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	writeFnJSON(w, http.StatusOK, s.appView(app))
}

func (s *Service) fnListApps(w http.ResponseWriter, r *http.Request) {
	after, perPage := httpapi.PageParams(r)
	scope, limit := httpapi.ProjectScope(r.Context()), perPage
	if scope != nil { // a confined token sees its projects' apps (docs/teams.md): the page is filled after the filter
		limit = 0
	}
	var apps []store.App
	err := s.store.View(r.Context(), func(tx store.Tx) (err error) {
		apps, err = tx.ListApps(store.ListFnOptions{Name: r.URL.Query().Get("name"), After: after, Limit: limit})
		return err
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	if scope != nil {
		apps = slices.DeleteFunc(apps, func(a store.App) bool { return !slices.Contains(scope, api.ProjectOf(a.Project)) })
		apps = apps[:min(len(apps), perPage)]
	}
	var out api.AppList
	out.Items, out.NextCursor = httpapi.ListPage(apps, perPage, s.appView, func(a store.App) string { return a.Name })
	writeFnJSON(w, http.StatusOK, out)
}

func (s *Service) fnUpdateApp(w http.ResponseWriter, r *http.Request) {
	var patch api.App
	if err := decodeFn(r, &patch); err != nil {
		s.fnFail(w, err)
		return
	}
	id := r.PathValue("app_id")
	if patch.ID != "" && patch.ID != id {
		s.fnFail(w, errFnAppIDMismatch)
		return
	}
	ann, err := compactAnnotations(patch.Annotations, true)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	if err := validSyslogURL(patch.SyslogURL); err != nil {
		s.fnFail(w, err)
		return
	}
	var wasPublic bool
	var app store.App
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		var err error
		app, err = tx.GetApp(id)
		if err != nil {
			return notFoundAs(err, errFnAppNotFound)
		}
		if patch.Name != "" && patch.Name != app.Name {
			return errFnAppNameImmutable
		}
		if patch.Project != "" && patch.Project != api.ProjectOf(app.Project) {
			return failure.Invalid("project", "an app's project is set when it is created; create the app again in project %q", patch.Project)
		}
		was, _ := json.Marshal(app)
		wasPublic = appPublic(app.Annotations)
		if app.Config, err = mergeConfig(app.Config, patch.Config); err != nil {
			return err
		}
		if app.SealedConfig, err = s.mergeSecrets(appSecretOwner(app), app.SealedConfig, app.SecretConfig, patch.SecretConfig); err != nil {
			return err
		}
		app.SecretConfig = nil
		if app.Annotations, err = mergeAnnotations(app.Annotations, ann); err != nil {
			return err
		}
		if patch.SyslogURL != nil {
			app.SyslogURL = patch.SyslogURL
			if *patch.SyslogURL == "" {
				app.SyslogURL = nil
			}
		}
		if now, _ := json.Marshal(app); !bytes.Equal(was, now) {
			app.UpdatedAt = fnTime(s.now())
		}
		return tx.PutApp(app)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.forgetApp(app.ID)
	notePublicChange(r.Context(), "app "+app.Name, wasPublic, appPublic(app.Annotations))
	writeFnJSON(w, http.StatusOK, s.appView(app))
}

// fnDeleteApp deletes an app with its functions and triggers (Fn's
// datastore removes them too); durable calls stay readable.
func (s *Service) fnDeleteApp(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("app_id")
	err := s.store.Update(r.Context(), func(tx store.Tx) error {
		if _, err := tx.GetApp(id); err != nil {
			return notFoundAs(err, errFnAppNotFound)
		}
		triggers, err := tx.ListTriggers(store.ListFnOptions{AppID: id})
		if err != nil {
			return err
		}
		for _, t := range triggers {
			if err := tx.DeleteTrigger(t.ID); err != nil {
				return err
			}
		}
		fns, err := tx.ListFns(store.ListFnOptions{AppID: id})
		if err != nil {
			return err
		}
		for _, f := range fns {
			if err := tx.DeleteFn(f.ID); err != nil {
				return err
			}
		}
		return tx.DeleteApp(id)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.forgetApp(id)
	w.WriteHeader(http.StatusNoContent)
}

// Fns.
