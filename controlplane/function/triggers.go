package function

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

func validateTriggerName(name string) error {
	switch {
	case name == "":
		return errTriggerMissingName
	case len(name) > api.MaxFnNameLength:
		return errTriggerTooLongName
	case !validName(name):
		return errTriggerInvalidName
	}
	return nil
}

func validateTrigger(t api.Trigger) error {
	switch {
	case t.AppID == "":
		return errTriggerMissingApp
	case validateTriggerName(t.Name) != nil:
		return validateTriggerName(t.Name)
	case t.FnID == "":
		return errTriggerMissingFn
	case t.Type != "http":
		return errTriggerType
	case t.Source == "":
		return errTriggerMissingSrc
	case !strings.HasPrefix(t.Source, "/"):
		return errTriggerSrcPrefix
	}
	return nil
}

// checkTrigger checks, inside tx, that t's app and function exist and
// agree and that its name and source are free; it returns the app's name.
func checkTrigger(tx store.Tx, t store.Trigger) (string, error) {
	app, err := tx.GetApp(t.AppID)
	if err != nil {
		return "", notFoundAs(err, errFnAppNotFound)
	}
	f, err := tx.GetFn(t.FnID)
	if err != nil {
		return "", notFoundAs(err, errFnNotFound)
	}
	if f.AppID != t.AppID {
		return "", errTriggerFnNotSameApp
	}
	same, err := tx.ListTriggers(store.ListFnOptions{AppID: t.AppID, Name: t.Name})
	if err != nil {
		return "", err
	}
	if len(same) > 0 && same[0].ID != t.ID {
		return "", errTriggerExists
	}
	if other, err := tx.GetTriggerBySource(t.AppID, t.Type, t.Source); err == nil && other.ID != t.ID {
		return "", errTriggerSourceExists
	} else if err != nil && !errors.Is(err, failure.ErrNotFound) {
		return "", err
	}
	return app.Name, nil
}

func (s *Service) fnCreateTrigger(w http.ResponseWriter, r *http.Request) {
	var in api.Trigger
	if err := decodeFn(r, &in); err != nil {
		s.fnFail(w, err)
		return
	}
	if in.ID != "" {
		s.fnFail(w, errTriggerIDProvided)
		return
	}
	if err := validateTrigger(in); err != nil {
		s.fnFail(w, err)
		return
	}
	ann, err := compactAnnotations(in.Annotations, false)
	if err == nil {
		ann, err = mergeAnnotations(nil, ann)
	}
	if err != nil {
		s.fnFail(w, err)
		return
	}
	now := fnTime(s.now())
	t := store.Trigger{Trigger: api.Trigger{ID: httpapi.NewID("tr-"), Name: in.Name, AppID: in.AppID, FnID: in.FnID, Type: in.Type,
		Source: in.Source, Annotations: ann, CreatedAt: now, UpdatedAt: now}}
	var appName string
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		var err error
		if appName, err = checkTrigger(tx, t); err != nil {
			return err
		}
		err = tx.CreateTrigger(t)
		if errors.Is(err, failure.ErrConflict) {
			return errTriggerExists
		}
		return err
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	notePublicChange(r.Context(), "trigger "+t.Name, false, triggerPublic(t.Annotations))
	writeFnJSON(w, http.StatusOK, s.triggerView(t, appName))
}

func (s *Service) fnGetTrigger(w http.ResponseWriter, r *http.Request) {
	var t store.Trigger
	var appName string
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		var err error
		if t, err = tx.GetTrigger(r.PathValue("trigger_id")); err != nil {
			return notFoundAs(err, errTriggerNotFound)
		}
		if app, err := tx.GetApp(t.AppID); err == nil {
			appName = app.Name
		}
		return nil
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	writeFnJSON(w, http.StatusOK, s.triggerView(t, appName))
}

func (s *Service) fnListTriggers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	appID := q.Get("app_id")
	if appID == "" {
		s.fnFail(w, errTriggerMissingApp) // Fn's datastore says this
		return
	}
	after, perPage := httpapi.PageParams(r)
	var triggers []store.Trigger
	var appName string
	err := s.store.View(r.Context(), func(tx store.Tx) (err error) {
		if app, err := tx.GetApp(appID); err == nil {
			appName = app.Name
		}
		triggers, err = tx.ListTriggers(store.ListFnOptions{AppID: appID, FnID: q.Get("fn_id"), Name: q.Get("name"), After: after, Limit: perPage})
		return err
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	var out api.TriggerList
	out.Items, out.NextCursor = httpapi.ListPage(triggers, perPage,
		func(t store.Trigger) api.Trigger { return s.triggerView(t, appName) },
		func(t store.Trigger) string { return t.Name })
	writeFnJSON(w, http.StatusOK, out)
}

func (s *Service) fnUpdateTrigger(w http.ResponseWriter, r *http.Request) {
	var patch api.Trigger
	if err := decodeFn(r, &patch); err != nil {
		s.fnFail(w, err)
		return
	}
	id := r.PathValue("trigger_id")
	if patch.ID != "" && patch.ID != id {
		s.fnFail(w, errTriggerIDMismatch)
		return
	}
	ann, err := compactAnnotations(patch.Annotations, true)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	var t store.Trigger
	var appName string
	var wasPublic bool
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		var err error
		if t, err = tx.GetTrigger(id); err != nil {
			return notFoundAs(err, errTriggerNotFound)
		}
		if patch.AppID != "" && patch.AppID != t.AppID {
			return errTriggerFnNotSameApp
		}
		if patch.Type != "" && patch.Type != t.Type {
			return errTriggerType
		}
		was, _ := json.Marshal(t)
		wasPublic = triggerPublic(t.Annotations)
		if patch.Name != "" {
			t.Name = patch.Name
		}
		if patch.FnID != "" {
			t.FnID = patch.FnID
		}
		if patch.Source != "" {
			t.Source = patch.Source
		}
		if t.Annotations, err = mergeAnnotations(t.Annotations, ann); err != nil {
			return err
		}
		if err := validateTrigger(t.Trigger); err != nil {
			return err
		}
		if appName, err = checkTrigger(tx, t); err != nil {
			return err
		}
		if now, _ := json.Marshal(t); !bytes.Equal(was, now) {
			t.UpdatedAt = fnTime(s.now())
		}
		return tx.PutTrigger(t)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.forgetApp(t.AppID)
	notePublicChange(r.Context(), "trigger "+t.Name, wasPublic, triggerPublic(t.Annotations))
	writeFnJSON(w, http.StatusOK, s.triggerView(t, appName))
}

func (s *Service) fnDeleteTrigger(w http.ResponseWriter, r *http.Request) {
	var appID string
	err := s.store.Update(r.Context(), func(tx store.Tx) error {
		t, err := tx.GetTrigger(r.PathValue("trigger_id"))
		if err != nil {
			return notFoundAs(err, errTriggerNotFound)
		}
		appID = t.AppID
		return tx.DeleteTrigger(t.ID)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.forgetApp(appID)
	w.WriteHeader(http.StatusNoContent)
}

// Durable calls.
