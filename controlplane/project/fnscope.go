package project

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// An app belongs to a project, and so do its functions, triggers and calls
// (docs/teams.md). A token confined to projects is held to theirs as it is
// to their runs: GET /v2/apps lists only their apps (fnListApps), and
// every route about one app, function, trigger or call of another
// project, or one creating a function or trigger in such an app, is
// refused (403, naming the token and the project). An unconfined caller
// costs nothing here; a confined one, one read per request. Package
// function wraps its routes so (ScopeFnRoutes).

// projectOf finds the project of what a request is about.
type projectOf func(tx store.Tx, r *http.Request) (string, error)

// scopes are the routes confined callers are checked on, by pattern.
var scopes = map[string]projectOf{
	"GET /v2/apps/{app_id}":                      byPathApp,
	"PUT /v2/apps/{app_id}":                      byPathApp,
	"DELETE /v2/apps/{app_id}":                   byPathApp,
	"GET /v2/fns":                                byQueryApp,
	"POST /v2/fns":                               byBodyApp,
	"GET /v2/fns/{fn_id}":                        byPathFn,
	"PUT /v2/fns/{fn_id}":                        byPathFn,
	"DELETE /v2/fns/{fn_id}":                     byPathFn,
	"GET /v2/fns/{fn_id}/calls":                  byPathFn,
	"GET /v2/fns/{fn_id}/calls/{call_id}":        byPathFn,
	"GET /v2/fns/{fn_id}/calls/{call_id}/log":    byPathFn,
	"GET /v2/fns/{fn_id}/calls/{call_id}/result": byPathFn,
	"GET /v2/triggers":                           byQueryApp,
	"POST /v2/triggers":                          byBodyApp,
	"GET /v2/triggers/{trigger_id}":              byPathTrigger,
	"PUT /v2/triggers/{trigger_id}":              byPathTrigger,
	"DELETE /v2/triggers/{trigger_id}":           byPathTrigger,
	"POST /invoke/{fn_id}":                       byPathFn,
	"POST /invoke/{fn_id}/async":                 byPathFn,
}

// View is a store's read transaction (store.Store.View).
type View func(ctx context.Context, fn func(store.Tx) error) error

// ScopeFnRoutes wraps the Functions routes in scopes with the check,
// reading through view; fail writes a refusal in Fn's shape.
func ScopeFnRoutes(view View, routes []httpapi.Route, fail func(http.ResponseWriter, error)) []httpapi.Route {
	for i, rt := range routes {
		if of, ok := scopes[rt.Pattern]; ok {
			routes[i].Handler = scopedFn(view, of, fail, rt.Handler)
		}
	}
	return routes
}

// scopedFn is h behind the check: a confined caller reaches h only for an
// object of one of its projects. What does not exist is left to h to
// answer, in Fn's words.
func scopedFn(view View, of projectOf, fail func(http.ResponseWriter, error), h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if httpapi.ProjectScope(r.Context()) != nil {
			var proj string
			err := view(r.Context(), func(tx store.Tx) (err error) { proj, err = of(tx, r); return err })
			if err == nil {
				err = Confine(r, proj, "use apps")
			}
			if err != nil && !errors.Is(err, failure.ErrNotFound) {
				fail(w, err)
				return
			}
		}
		h(w, r)
	}
}

func appProject(tx store.Tx, id string) (string, error) {
	if id == "" {
		return "", failure.NotFound("app", id)
	}
	app, err := tx.GetApp(id)
	return app.Project, err
}

func byPathApp(tx store.Tx, r *http.Request) (string, error) {
	return appProject(tx, r.PathValue("app_id"))
}

func byQueryApp(tx store.Tx, r *http.Request) (string, error) {
	return appProject(tx, r.URL.Query().Get("app_id"))
}

func byPathFn(tx store.Tx, r *http.Request) (string, error) {
	f, err := tx.GetFn(r.PathValue("fn_id"))
	if err != nil {
		return "", err
	}
	return appProject(tx, f.AppID)
}

func byPathTrigger(tx store.Tx, r *http.Request) (string, error) {
	t, err := tx.GetTrigger(r.PathValue("trigger_id"))
	if err != nil {
		return "", err
	}
	return appProject(tx, t.AppID)
}

// byBodyApp reads the app_id of a body that creates a function or a
// trigger, and puts the body back for the handler (read at most
// httpapi.MaxBody, the handler's own limit).
func byBodyApp(tx store.Tx, r *http.Request) (string, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, httpapi.MaxBody+1))
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return "", failure.Invalid("body", "reading the request: %v", err)
	}
	var in struct {
		AppID string `json:"app_id"`
	}
	_ = json.Unmarshal(body, &in) // a bad body is the handler's to refuse
	return appProject(tx, in.AppID)
}
