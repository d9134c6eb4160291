package controlplane

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// Functions: the Fn Project's v2 API. This file is the management half
// (apps, fns, triggers, and reading durable calls); invoke.go places calls
// on nodes, functions_async.go delivers durable ones.
//
// The routes follow Fn's paths, fields, status codes, validation messages
// and error body ({"message": "…"}), so the Fn CLI and Fn's clients work
// against them; everything else about the control plane (its own /v1 API,
// its error shape) is untouched. Where Mercator differs, docs/functions.md
// says how and why. The main ones:
//
//   - Every route needs the admin bearer credential, invoke and triggers
//     included; Fn leaves that to an extension. Because Authorization
//     carries Mercator's credential, it is never passed to a function.
//   - A function's image is pinned to a manifest digest when it is created
//     or its image is set (PinnedImage), through the resolver Runs use.
//   - Functions may ask for CPU, GPUs and a per-node concurrency cap, and
//     apps and functions may hold secret configuration, which no read ever
//     returns.
//   - Unknown JSON fields are ignored, as Fn's handlers ignore them (the
//     /v1 API refuses them): Fn clients send fields of their own versions.

// functionRoutes are the Fn-compatible routes, appended to publicRoutes.
func (s *Server) functionRoutes() []httpapi.Route {
	routes := []httpapi.Route{
		{Pattern: "GET /v2/apps", Handler: s.fnListApps},
		{Pattern: "POST /v2/apps", Handler: s.fnCreateApp},
		{Pattern: "GET /v2/apps/{app_id}", Handler: s.fnGetApp},
		{Pattern: "PUT /v2/apps/{app_id}", Handler: s.fnUpdateApp},
		{Pattern: "DELETE /v2/apps/{app_id}", Handler: s.fnDeleteApp},
		{Pattern: "GET /v2/fns", Handler: s.fnListFns},
		{Pattern: "POST /v2/fns", Handler: s.fnCreateFn},
		{Pattern: "GET /v2/fns/{fn_id}", Handler: s.fnGetFn},
		{Pattern: "PUT /v2/fns/{fn_id}", Handler: s.fnUpdateFn},
		{Pattern: "DELETE /v2/fns/{fn_id}", Handler: s.fnDeleteFn},
		{Pattern: "GET /v2/fns/{fn_id}/calls", Handler: s.fnListCalls},
		{Pattern: "GET /v2/fns/{fn_id}/calls/{call_id}", Handler: s.fnGetCall},
		{Pattern: "GET /v2/fns/{fn_id}/calls/{call_id}/log", Handler: s.fnGetCallLog},
		{Pattern: "GET /v2/fns/{fn_id}/calls/{call_id}/result", Handler: s.fnGetCallResult},
		{Pattern: "GET /v2/triggers", Handler: s.fnListTriggers},
		{Pattern: "POST /v2/triggers", Handler: s.fnCreateTrigger},
		{Pattern: "GET /v2/triggers/{trigger_id}", Handler: s.fnGetTrigger},
		{Pattern: "PUT /v2/triggers/{trigger_id}", Handler: s.fnUpdateTrigger},
		{Pattern: "DELETE /v2/triggers/{trigger_id}", Handler: s.fnDeleteTrigger},
		{Pattern: "POST /invoke/{fn_id}", Handler: s.fnInvoke},
		{Pattern: "POST /invoke/{fn_id}/async", Handler: s.fnInvokeAsync},
	}
	for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		routes = append(routes, httpapi.Route{Pattern: m + " /t/{app_name}/{source...}", Handler: s.fnTrigger})
	}
	return routes
}

// isFnPath reports whether a path belongs to the Fn-compatible API, whose
// errors take Fn's shape.
func isFnPath(p string) bool {
	return strings.HasPrefix(p, "/v2/") || strings.HasPrefix(p, "/invoke/") || strings.HasPrefix(p, "/t/")
}

// writeAuthError writes an authentication failure in the shape the route's
// API uses.
func writeAuthError(w http.ResponseWriter, r *http.Request, err error) {
	if isFnPath(r.URL.Path) {
		writeFnError(w, api.StatusOf(err), err.Error())
		return
	}
	httpapi.WriteError(w, err)
}

// fnErr is an error with the status Fn answers it with.
type fnErr struct {
	status  int
	message string
}

func (e *fnErr) Error() string { return e.message }

func fnError(status int, format string, args ...any) error {
	return &fnErr{status: status, message: fmt.Sprintf(format, args...)}
}

// Fn's messages, where Fn has one.
var (
	errFnInvalidJSON       = fnError(http.StatusBadRequest, "Invalid JSON")
	errFnAppNotFound       = fnError(http.StatusNotFound, "App not found")
	errFnAppExists         = fnError(http.StatusConflict, "App already exists")
	errFnAppIDProvided     = fnError(http.StatusBadRequest, "App ID cannot be supplied on create")
	errFnAppIDMismatch     = fnError(http.StatusBadRequest, "App ID in path does not match ID in body")
	errFnAppNameImmutable  = fnError(http.StatusConflict, "Could not update - name is immutable")
	errFnMissingName       = fnError(http.StatusBadRequest, "Missing Name")
	errFnAppTooLongName    = fnError(http.StatusBadRequest, "App name must be %d characters or less", api.MaxFnNameLength)
	errFnAppInvalidName    = fnError(http.StatusBadRequest, "Invalid app name")
	errFnMissingAppID      = fnError(http.StatusBadRequest, "Missing App ID")
	errFnNotFound          = fnError(http.StatusNotFound, "Fn not found")
	errFnExists            = fnError(http.StatusConflict, "Fn with specified name already exists")
	errFnIDProvided        = fnError(http.StatusBadRequest, "ID cannot be provided for Fn creation")
	errFnIDMismatch        = fnError(http.StatusBadRequest, "Fn ID in path does not match that in body")
	errFnMissingFnName     = fnError(http.StatusBadRequest, "Missing Fn name")
	errFnTooLongName       = fnError(http.StatusBadRequest, "Fn name must be %d characters or less", api.MaxFnNameLength)
	errFnInvalidName       = fnError(http.StatusBadRequest, "name must be a valid string")
	errFnFieldChange       = fnError(http.StatusBadRequest, "Fn names and IDs cannot be modified")
	errFnMissingFnAppID    = fnError(http.StatusBadRequest, "Missing AppID on Fn")
	errFnMissingImage      = fnError(http.StatusBadRequest, "Missing image on Fn")
	errFnInvalidTimeout    = fnError(http.StatusBadRequest, "timeout value is out of range, must be between 0 and %d", api.FnMaxTimeout)
	errFnInvalidIdle       = fnError(http.StatusBadRequest, "idle_timeout value is out of range, must be between 0 and %d", api.FnMaxIdleTimeout)
	errFnInvalidMemory     = fnError(http.StatusBadRequest, "memory value is out of range. It should be between %d and %d", api.FnMinMemoryMB, api.FnMaxMemoryMB)
	errTriggerNotFound     = fnError(http.StatusNotFound, "Trigger not found")
	errTriggerExists       = fnError(http.StatusConflict, "Trigger already exists")
	errTriggerSourceExists = fnError(http.StatusConflict, "Trigger with the same type and source exists on this app")
	errTriggerIDProvided   = fnError(http.StatusBadRequest, "ID cannot be provided for Trigger creation")
	errTriggerIDMismatch   = fnError(http.StatusBadRequest, "ID in path does not match ID in body")
	errTriggerMissingName  = fnError(http.StatusBadRequest, "Missing name on Trigger")
	errTriggerTooLongName  = fnError(http.StatusBadRequest, "Trigger name must be %d characters or less", api.MaxFnNameLength)
	errTriggerInvalidName  = fnError(http.StatusBadRequest, "Invalid name for Trigger")
	errTriggerMissingApp   = fnError(http.StatusBadRequest, "Missing App ID on Trigger")
	errTriggerMissingFn    = fnError(http.StatusBadRequest, "Missing Fn ID on Trigger")
	errTriggerFnNotSameApp = fnError(http.StatusBadRequest, "Invalid Fn ID - not owned by specified app")
	errTriggerType         = fnError(http.StatusBadRequest, "Trigger Type Not Supported")
	errTriggerMissingSrc   = fnError(http.StatusBadRequest, "Missing Trigger Source")
	errTriggerSrcPrefix    = fnError(http.StatusBadRequest, "Missing Trigger Source Prefix '/'")
	errCallNotFound        = fnError(http.StatusNotFound, "Call not found")
	errCallLogNotFound     = fnError(http.StatusNotFound, "Call log not found")

	errAnnotationKey      = fnError(http.StatusBadRequest, "Invalid annotation key, annotation keys must be non-empty ascii strings excluding whitespace")
	errAnnotationKeyLen   = fnError(http.StatusBadRequest, "Invalid annotation key length, annotation keys may not be larger than %d bytes", api.MaxAnnotationKey)
	errAnnotationValue    = fnError(http.StatusBadRequest, "Invalid annotation value, annotation values may only be non-empty strings, numbers, objects, or arrays")
	errAnnotationValueLen = fnError(http.StatusBadRequest, "Invalid annotation value length, annotation values may not be larger than %d bytes when serialized as JSON", api.MaxAnnotationVal)
	errTooManyAnnotations = fnError(http.StatusBadRequest, "Invalid annotation change, new key(s) exceed maximum permitted number of annotations keys (%d)", api.MaxAnnotations)
)

func writeFnError(w http.ResponseWriter, status int, message string) {
	httpapi.WriteJSON(w, status, api.FnError{Message: message})
}

// fnFail writes err in Fn's shape: an fnErr as it is, a failure kind by its
// status, anything else as Fn's internal error.
func (s *Server) fnFail(w http.ResponseWriter, err error) {
	var fe *fnErr
	switch {
	case errors.As(err, &fe):
		writeFnError(w, fe.status, fe.message)
	case errors.Is(err, context.Canceled):
		// The caller went away; nobody reads this.
	default:
		status := api.StatusOf(err)
		msg := err.Error()
		if status == http.StatusInternalServerError {
			s.log.Error("functions API", "err", err)
			msg = "internal server error"
		}
		writeFnError(w, status, msg)
	}
}

// decodeFn reads one JSON object into v as Fn does: unknown fields are
// ignored, malformed JSON is Fn's "Invalid JSON".
func decodeFn(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, httpapi.MaxBody+1))
	if err != nil || len(body) > httpapi.MaxBody {
		return errFnInvalidJSON
	}
	if err := json.Unmarshal(body, v); err != nil {
		return errFnInvalidJSON
	}
	return nil
}

// fnTime is a moment as Fn shows it: UTC, milliseconds.
func fnTime(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

// validName is Fn's rule for app, function and trigger names: letters,
// digits, '_' and '-'.
func validName(name string) bool {
	for _, c := range name {
		if !(unicode.IsLetter(c) || unicode.IsNumber(c) || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

var annotationKey = regexp.MustCompile(`^[!-~]+$`)

// emptyAnnotation is an annotation value that means "delete" in an update
// and is refused in a create.
func emptyAnnotation(v json.RawMessage) bool {
	s := strings.TrimSpace(string(v))
	return s == `""` || s == "null" || s == ""
}

// compactAnnotations validates annotations as Fn does and returns them
// with compacted values. allowEmpty accepts deletions (an update's patch).
func compactAnnotations(in api.Annotations, allowEmpty bool) (api.Annotations, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := api.Annotations{}
	for k, v := range in {
		if !annotationKey.MatchString(k) {
			return nil, errAnnotationKey
		}
		if len(k) > api.MaxAnnotationKey {
			return nil, errAnnotationKeyLen
		}
		if emptyAnnotation(v) {
			if !allowEmpty {
				return nil, errAnnotationValue
			}
			out[k] = json.RawMessage(`""`)
			continue
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, v); err != nil {
			return nil, errAnnotationValue
		}
		if buf.Len() > api.MaxAnnotationVal {
			return nil, errAnnotationValueLen
		}
		out[k] = json.RawMessage(buf.Bytes())
	}
	return out, nil
}

// mergeAnnotations applies a validated patch: empty values delete.
func mergeAnnotations(old, patch api.Annotations) (api.Annotations, error) {
	out := api.Annotations{}
	for k, v := range old {
		out[k] = v
	}
	for k, v := range patch {
		if emptyAnnotation(v) {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	if len(out) > api.MaxAnnotations {
		return nil, errTooManyAnnotations
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// reservedEnv are the variables Fn's container contract sets (fnagent's
// list); configuration may not set them.
var reservedEnv = map[string]bool{"FN_LISTENER": true, "FN_FORMAT": true, "FN_FN_ID": true, "FN_APP_ID": true, "FN_FN_NAME": true,
	"FN_APP_NAME": true, "FN_MEMORY": true, "FN_TYPE": true, "FN_LOGFRAME_NAME": true, "FN_LOGFRAME_HDR": true}

// checkConfigKey refuses a configuration key one cannot set as an
// environment variable, or one of the container contract's FN_ names.
func checkConfigKey(k string) error {
	if k == "" || strings.ContainsAny(k, "=\x00") || reservedEnv[k] {
		return fnError(http.StatusBadRequest, "Invalid config key %q: config keys become environment variables; the FN_ names of the container contract are reserved", k)
	}
	return nil
}

// mergeConfig applies a configuration patch as Fn does: an empty value
// deletes the key. Keys become environment variables, so they must be
// names one can set. (Secret configuration is sealed: mergeSecrets.)
func mergeConfig(old, patch map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for k, v := range old {
		out[k] = v
	}
	for k, v := range patch {
		if err := checkConfigKey(k); err != nil {
			return nil, err
		}
		if v == "" {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

func validSyslogURL(u *string) error {
	if u == nil || *u == "" {
		return nil
	}
	parsed, err := url.Parse(strings.TrimSpace(*u))
	if err == nil {
		switch parsed.Scheme {
		case "udp", "tcp", "unix", "unixgram", "tcp+tls":
		default:
			err = errors.New("invalid scheme, only [tcp, udp, unix, unixgram, tcp+tls] are supported")
		}
	}
	if err != nil {
		return fnError(http.StatusBadRequest, "invalid syslog url: %q %v", *u, err)
	}
	return nil
}

// publicBase is the URL annotations point at.
func (s *Server) publicBase() string { return strings.TrimRight(s.cfg.PublicURL, "/") }

// appView is an app as reads show it.
func (s *Server) appView(a store.App) api.App {
	out := a.App
	out.SecretConfig = redactedSecrets(a.SealedConfig, a.SecretConfig)
	out.CreatedAt, out.UpdatedAt = fnTime(out.CreatedAt), fnTime(out.UpdatedAt)
	return out
}

// fnView is a function as reads show it, with Fn's invoke endpoint.
func (s *Server) fnView(f store.Fn) api.Fn {
	out := f.Fn
	out.SecretConfig = redactedSecrets(f.SealedConfig, f.SecretConfig)
	ann := api.Annotations{}
	for k, v := range f.Annotations {
		ann[k] = v
	}
	endpoint, _ := json.Marshal(s.publicBase() + "/invoke/" + f.ID)
	ann[api.AnnotationInvokeEndpoint] = endpoint
	out.Annotations = ann
	out.CreatedAt, out.UpdatedAt = fnTime(out.CreatedAt), fnTime(out.UpdatedAt)
	return out
}

// triggerView is a trigger as reads show it, with Fn's HTTP endpoint.
func (s *Server) triggerView(t store.Trigger, appName string) api.Trigger {
	out := t.Trigger
	ann := api.Annotations{}
	for k, v := range t.Annotations {
		ann[k] = v
	}
	if appName != "" {
		endpoint, _ := json.Marshal(s.publicBase() + "/t/" + url.PathEscape(appName) + t.Source)
		ann[api.AnnotationTriggerEndpoint] = endpoint
	}
	out.Annotations = ann
	out.CreatedAt, out.UpdatedAt = fnTime(out.CreatedAt), fnTime(out.UpdatedAt)
	return out
}

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

func (s *Server) fnCreateApp(w http.ResponseWriter, r *http.Request) {
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
		SyslogURL: in.SyslogURL, CreatedAt: now, UpdatedAt: now}, SealedConfig: sealed}
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		if _, err := tx.GetAppByName(app.Name); err == nil {
			return errFnAppExists
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
	httpapi.WriteJSON(w, http.StatusOK, s.appView(app))
}

func (s *Server) fnGetApp(w http.ResponseWriter, r *http.Request) {
	var app store.App
	err := s.store.View(r.Context(), func(tx store.Tx) (err error) {
		app, err = tx.GetApp(r.PathValue("app_id"))
		return notFoundAs(err, errFnAppNotFound)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, s.appView(app))
}

func (s *Server) fnListApps(w http.ResponseWriter, r *http.Request) {
	after, perPage := httpapi.PageParams(r)
	var apps []store.App
	err := s.store.View(r.Context(), func(tx store.Tx) (err error) {
		apps, err = tx.ListApps(store.ListFnOptions{Name: r.URL.Query().Get("name"), After: after, Limit: perPage})
		return err
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	var out api.AppList
	out.Items, out.NextCursor = httpapi.ListPage(apps, perPage, s.appView, func(a store.App) string { return a.Name })
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) fnUpdateApp(w http.ResponseWriter, r *http.Request) {
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
		was, _ := json.Marshal(app)
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
	s.fn.forgetApp(app.ID)
	httpapi.WriteJSON(w, http.StatusOK, s.appView(app))
}

// fnDeleteApp deletes an app with its functions and triggers (Fn's
// datastore removes them too); durable calls stay readable.
func (s *Server) fnDeleteApp(w http.ResponseWriter, r *http.Request) {
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
	s.fn.forgetApp(id)
	w.WriteHeader(http.StatusNoContent)
}

// Fns.

// validateFnResources checks the ranges Fn checks (zero meaning the
// default, or unchanged in an update) and Mercator's additions.
func validateFnResources(f api.Fn) error {
	switch {
	case f.Timeout < 0 || f.Timeout > api.FnMaxTimeout:
		return errFnInvalidTimeout
	case f.IdleTimeout < 0 || f.IdleTimeout > api.FnMaxIdleTimeout:
		return errFnInvalidIdle
	case f.Memory != 0 && (f.Memory < api.FnMinMemoryMB || f.Memory > api.FnMaxMemoryMB):
		return errFnInvalidMemory
	case f.CPU < 0 || f.CPU > 1024:
		return fnError(http.StatusBadRequest, "cpu value is out of range. It should be between 0 and 1024 cores")
	case f.GPUs < 0 || f.GPUs > 64:
		return fnError(http.StatusBadRequest, "gpus value is out of range. It should be between 0 and 64")
	case f.MaxConcurrency < 0:
		return fnError(http.StatusBadRequest, "max_concurrency value is out of range. It should be 0 (no cap) or more")
	case f.GPUModel != "" && f.GPUs == 0:
		return fnError(http.StatusBadRequest, "gpu_model is set but gpus is 0")
	}
	return nil
}

func validateFnName(name string) error {
	switch {
	case name == "":
		return errFnMissingFnName
	case len(name) > api.MaxFnNameLength:
		return errFnTooLongName
	case !validName(name):
		return errFnInvalidName
	}
	return nil
}

// pin resolves a function's image to a manifest digest.
func (s *Server) pin(ctx context.Context, image string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pinned, err := s.resolver.Resolve(ctx, image)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, failure.ErrUnavailable) {
			status = http.StatusServiceUnavailable
		}
		return "", fnError(status, "Invalid image %q: %v", image, err)
	}
	return pinned, nil
}

func (s *Server) fnCreateFn(w http.ResponseWriter, r *http.Request) {
	var in api.Fn
	if err := decodeFn(r, &in); err != nil {
		s.fnFail(w, err)
		return
	}
	var err error
	switch {
	case in.ID != "":
		err = errFnIDProvided
	case validateFnName(in.Name) != nil:
		err = validateFnName(in.Name)
	case in.AppID == "":
		err = errFnMissingFnAppID
	case in.Image == "":
		err = errFnMissingImage
	default:
		err = validateFnResources(in)
	}
	if err != nil {
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
	config, err := mergeConfig(nil, in.Config)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	id := httpapi.NewID("fn-")
	sealed, err := s.mergeSecrets(secretOwner{"fn", id}, nil, nil, in.SecretConfig)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	// The app must exist before the image is resolved, so a typo in the
	// app costs no registry round trip.
	if err := s.store.View(r.Context(), func(tx store.Tx) error {
		_, err := tx.GetApp(in.AppID)
		return notFoundAs(err, errFnAppNotFound)
	}); err != nil {
		s.fnFail(w, err)
		return
	}
	pinned, err := s.pin(r.Context(), in.Image)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	now := fnTime(s.now())
	f := store.Fn{Fn: api.Fn{ID: id, Name: in.Name, AppID: in.AppID, Image: in.Image, PinnedImage: pinned,
		Memory: in.Memory, Timeout: in.Timeout, IdleTimeout: in.IdleTimeout, Config: config, Annotations: ann,
		CPU: in.CPU, GPUs: in.GPUs, GPUModel: in.GPUModel, MaxConcurrency: in.MaxConcurrency, CreatedAt: now, UpdatedAt: now},
		SealedConfig: sealed}
	if f.Memory == 0 {
		f.Memory = api.FnDefaultMemoryMB
	}
	if f.Timeout == 0 {
		f.Timeout = api.FnDefaultTimeout
	}
	if f.IdleTimeout == 0 {
		f.IdleTimeout = api.FnDefaultIdle
	}
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		if _, err := tx.GetApp(f.AppID); err != nil {
			return notFoundAs(err, errFnAppNotFound)
		}
		if dup, err := tx.ListFns(store.ListFnOptions{AppID: f.AppID, Name: f.Name}); err != nil {
			return err
		} else if len(dup) > 0 {
			return errFnExists
		}
		err := tx.CreateFn(f)
		if errors.Is(err, failure.ErrConflict) {
			return errFnExists
		}
		return err
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.log.Info("function created", "fn", f.ID, "app", f.AppID, "name", f.Name, "image", pinned)
	httpapi.WriteJSON(w, http.StatusOK, s.fnView(f))
}

func (s *Server) fnGetFn(w http.ResponseWriter, r *http.Request) {
	var f store.Fn
	err := s.store.View(r.Context(), func(tx store.Tx) (err error) {
		f, err = tx.GetFn(r.PathValue("fn_id"))
		return notFoundAs(err, errFnNotFound)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, s.fnView(f))
}

func (s *Server) fnListFns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	appID := q.Get("app_id")
	if appID == "" {
		s.fnFail(w, errFnMissingAppID)
		return
	}
	after, perPage := httpapi.PageParams(r)
	var fns []store.Fn
	err := s.store.View(r.Context(), func(tx store.Tx) (err error) {
		fns, err = tx.ListFns(store.ListFnOptions{AppID: appID, Name: q.Get("name"), After: after, Limit: perPage})
		return err
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	var out api.FnList
	out.Items, out.NextCursor = httpapi.ListPage(fns, perPage, s.fnView, func(f store.Fn) string { return f.Name })
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// fnUpdateFn applies a patch as Fn does: zero fields are left as they are,
// config merges (an empty value deletes), annotations merge. An image in
// the patch is pinned again even when it is the same reference, so
// deploying a tag that moved takes the new image.
func (s *Server) fnUpdateFn(w http.ResponseWriter, r *http.Request) {
	var patch api.Fn
	if err := decodeFn(r, &patch); err != nil {
		s.fnFail(w, err)
		return
	}
	id := r.PathValue("fn_id")
	if patch.ID != "" && patch.ID != id {
		s.fnFail(w, errFnIDMismatch)
		return
	}
	ann, err := compactAnnotations(patch.Annotations, true)
	if err == nil {
		err = validateFnResources(api.Fn{Timeout: patch.Timeout, IdleTimeout: patch.IdleTimeout, Memory: patch.Memory,
			CPU: patch.CPU, GPUs: patch.GPUs, MaxConcurrency: patch.MaxConcurrency})
	}
	if err != nil {
		s.fnFail(w, err)
		return
	}
	var pinned string
	if patch.Image != "" {
		if pinned, err = s.pin(r.Context(), patch.Image); err != nil {
			s.fnFail(w, err)
			return
		}
	}
	var f store.Fn
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		var err error
		f, err = tx.GetFn(id)
		if err != nil {
			return notFoundAs(err, errFnNotFound)
		}
		if patch.Name != "" && patch.Name != f.Name || patch.AppID != "" && patch.AppID != f.AppID {
			return errFnFieldChange
		}
		was, _ := json.Marshal(f)
		if patch.Image != "" {
			f.Image, f.PinnedImage = patch.Image, pinned
		}
		if patch.Memory != 0 {
			f.Memory = patch.Memory
		}
		if patch.Timeout != 0 {
			f.Timeout = patch.Timeout
		}
		if patch.IdleTimeout != 0 {
			f.IdleTimeout = patch.IdleTimeout
		}
		if patch.CPU != 0 {
			f.CPU = patch.CPU
		}
		if patch.GPUs != 0 {
			f.GPUs = patch.GPUs
		}
		if patch.GPUModel != "" {
			f.GPUModel = patch.GPUModel
		}
		if patch.MaxConcurrency != 0 {
			f.MaxConcurrency = patch.MaxConcurrency
		}
		if f.Config, err = mergeConfig(f.Config, patch.Config); err != nil {
			return err
		}
		if f.SealedConfig, err = s.mergeSecrets(fnSecretOwner(f), f.SealedConfig, f.SecretConfig, patch.SecretConfig); err != nil {
			return err
		}
		f.SecretConfig = nil
		if f.Annotations, err = mergeAnnotations(f.Annotations, ann); err != nil {
			return err
		}
		if err := validateFnResources(f.Fn); err != nil {
			return err
		}
		if now, _ := json.Marshal(f); !bytes.Equal(was, now) {
			f.UpdatedAt = fnTime(s.now())
		}
		return tx.PutFn(f)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.fn.forgetFn(id)
	httpapi.WriteJSON(w, http.StatusOK, s.fnView(f))
}

// fnDeleteFn deletes a function and its triggers.
func (s *Server) fnDeleteFn(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("fn_id")
	err := s.store.Update(r.Context(), func(tx store.Tx) error {
		if _, err := tx.GetFn(id); err != nil {
			return notFoundAs(err, errFnNotFound)
		}
		triggers, err := tx.ListTriggers(store.ListFnOptions{FnID: id})
		if err != nil {
			return err
		}
		for _, t := range triggers {
			if err := tx.DeleteTrigger(t.ID); err != nil {
				return err
			}
		}
		return tx.DeleteFn(id)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.fn.forgetFn(id)
	w.WriteHeader(http.StatusNoContent)
}

// Triggers.

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

func (s *Server) fnCreateTrigger(w http.ResponseWriter, r *http.Request) {
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
	httpapi.WriteJSON(w, http.StatusOK, s.triggerView(t, appName))
}

func (s *Server) fnGetTrigger(w http.ResponseWriter, r *http.Request) {
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
	httpapi.WriteJSON(w, http.StatusOK, s.triggerView(t, appName))
}

func (s *Server) fnListTriggers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	appID := q.Get("app_id")
	if appID == "" {
		s.fnFail(w, errFnMissingAppID)
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
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) fnUpdateTrigger(w http.ResponseWriter, r *http.Request) {
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
	s.fn.forgetApp(t.AppID)
	httpapi.WriteJSON(w, http.StatusOK, s.triggerView(t, appName))
}

func (s *Server) fnDeleteTrigger(w http.ResponseWriter, r *http.Request) {
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
	s.fn.forgetApp(appID)
	w.WriteHeader(http.StatusNoContent)
}

// Durable calls.

// callView is a durable call as the API shows it.
func callView(c store.Call) api.FnCall {
	out := c.FnCall
	out.CreatedAt = fnTime(out.CreatedAt)
	if out.StartedAt != nil {
		t := fnTime(*out.StartedAt)
		out.StartedAt = &t
	}
	if out.CompletedAt != nil {
		t := fnTime(*out.CompletedAt)
		out.CompletedAt = &t
	}
	return out
}

// readCall returns the function's durable call.
func (s *Server) readCall(ctx context.Context, fnID, callID string) (store.Call, error) {
	var c store.Call
	err := s.store.View(ctx, func(tx store.Tx) (err error) {
		c, err = tx.GetCall(callID)
		if err == nil && c.FnID != fnID {
			err = failure.NotFound("call", callID)
		}
		return notFoundAs(err, errCallNotFound)
	})
	return c, err
}

func (s *Server) fnGetCall(w http.ResponseWriter, r *http.Request) {
	c, err := s.readCall(r.Context(), r.PathValue("fn_id"), r.PathValue("call_id"))
	if err != nil {
		s.fnFail(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, callView(c))
}

func (s *Server) fnListCalls(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	_, perPage := httpapi.PageParams(r)
	after := ""
	if c := q.Get("cursor"); c != "" {
		if b, err := base64.RawURLEncoding.DecodeString(c); err == nil {
			after = string(b)
		}
	}
	var calls []store.Call
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		if _, err := tx.GetFn(r.PathValue("fn_id")); err != nil {
			return notFoundAs(err, errFnNotFound)
		}
		var err error
		calls, err = tx.ListCalls(store.ListFnOptions{FnID: r.PathValue("fn_id"), After: after, Limit: perPage})
		return notFoundAs(err, errCallNotFound)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	var out api.FnCallList
	out.Items, out.NextCursor = httpapi.ListPage(calls, perPage, callView, func(c store.Call) string { return c.ID })
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// fnGetCallLog answers with the call's output: text, or Fn's JSON body
// when the client asks for application/json. A durable call's is stored
// with it (one that has not run yet has none); any other call ID is taken
// for a synchronous call's, whose log the nodes keep (functions_logs.go).
func (s *Server) fnGetCallLog(w http.ResponseWriter, r *http.Request) {
	fnID, callID := r.PathValue("fn_id"), r.PathValue("call_id")
	c, err := s.readCall(r.Context(), fnID, callID)
	text := c.Log
	switch {
	case errors.Is(err, errCallNotFound):
		text, err = s.fn.syncCallLog(r.Context(), fnID, callID)
	case err == nil && c.Status == api.CallQueued && c.Attempts == 0:
		err = errCallLogNotFound
	}
	if err != nil {
		s.fnFail(w, err)
		return
	}
	if strings.Contains(r.Header.Get("Accept"), "application/json") {
		httpapi.WriteJSON(w, http.StatusOK, api.CallLogResponse{Message: "Successfully loaded log", Log: api.CallLog{CallID: callID, Log: text}})
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, text)
}

// fnGetCallResult (Mercator) answers with the function's response to a
// durable call, as the function gave it: its status, headers and body.
func (s *Server) fnGetCallResult(w http.ResponseWriter, r *http.Request) {
	c, err := s.readCall(r.Context(), r.PathValue("fn_id"), r.PathValue("call_id"))
	if err == nil && c.ResponseStatus == 0 {
		err = fnError(http.StatusNotFound, "Call result not found: the call is %s", c.Status)
	}
	if err != nil {
		s.fnFail(w, err)
		return
	}
	for k, vs := range c.ResponseHeader {
		w.Header()[k] = append([]string(nil), vs...)
	}
	w.Header().Set("Fn-Call-Id", c.ID)
	w.WriteHeader(c.ResponseStatus)
	w.Write(c.ResponseBody)
}
