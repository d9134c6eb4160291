package function

import (
	"bytes"
	"context"
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
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/store"
)

// Functions: the Fn Project's v2 API. This file holds what the management
// half shares (its routes, Fn's error shape, validation, the views reads
// return); apps.go, fns.go, triggers.go and calls.go serve each resource;
// invoke.go places calls on nodes and relays them, async.go delivers
// durable ones.
//
// The routes follow Fn's paths, fields, status codes, validation messages
// and error body ({"message": "…"}), so the Fn CLI and Fn's clients work
// against them; everything else about the control plane (its own /v1 API,
// its error shape) is untouched. Where Mercator differs, docs/functions.md
// says how and why. The main ones:
//
//   - Every route needs a bearer credential of a role that allows it,
//     except invoke and triggers of an app (or a trigger) opened to
//     callers without one (public.go); Fn leaves authentication to an
//     extension. Because Authorization carries Mercator's credential, it
//     is never passed to a function.
//   - A function's image is pinned to a manifest digest when it is created
//     or its image is set (PinnedImage), through the resolver Runs use.
//   - Functions may ask for CPU, GPUs and a per-node concurrency cap, and
//     apps and functions may hold secret configuration, which no read ever
//     returns.
//   - Unknown JSON fields are ignored, as Fn's handlers ignore them (the
//     /v1 API refuses them): Fn clients send fields of their own versions.

// Routes are the Fn-compatible public routes, each served behind an API
// credential; a refusal takes Fn's shape (WriteAuthError).
func (s *Service) Routes() []httpapi.Route {
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
	return project.ScopeFnRoutes(s.view, routes, s.fnFail) // confined tokens (docs/teams.md)
}

// view is s.store.View as a method value, so the routes can be listed
// from a Service not yet built (the OpenAPI test does).
func (s *Service) view(ctx context.Context, fn func(store.Tx) error) error {
	return s.store.View(ctx, fn)
}

// FnVersion is the Fn server release whose v2 API these routes match:
// what /version answers, so a client that shows or compares the server's
// version (`fn version`) sees one it knows. Mercator's own version is
// `mercator version`'s.
const FnVersion = "0.3.753"

// Version answers Fn's GET /version, which needs no credential there
// either.
func (s *Service) Version(w http.ResponseWriter, _ *http.Request) {
	writeFnJSON(w, http.StatusOK, map[string]string{"version": FnVersion})
}

// FallbackPrefixes are the paths under which every request is Fn's to
// answer: what no route takes there gets Fallback's answer.
var FallbackPrefixes = []string{"/v2/", "/invoke/", "/t/"}

// Fallback answers a request under FallbackPrefixes that no route takes,
// in Fn's words and shape: 405 "Method not allowed" when the path is
// served with another method, 404 "Path not found" otherwise.
func (s *Service) Fallback() http.Handler {
	paths := http.NewServeMux()
	seen := map[string]bool{}
	served := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, rt := range s.Routes() {
		_, path, _ := strings.Cut(rt.Pattern, " ")
		if !seen[path] {
			seen[path] = true
			paths.Handle(path, served)
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := paths.Handler(r); pattern != "" {
			writeFnError(w, http.StatusMethodNotAllowed, "Method not allowed: "+r.Method+" "+r.URL.Path)
			return
		}
		writeFnError(w, http.StatusNotFound, "Path not found: "+r.Method+" "+r.URL.Path)
	})
}

// WriteAuthError writes a refusal of an API credential in Fn's error
// shape, for the routes Routes returns.
func WriteAuthError(w http.ResponseWriter, r *http.Request, err error) {
	writeFnError(w, api.StatusOf(err), err.Error())
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
	errFnInvalidMemory     = fnError(http.StatusBadRequest, "memory value is out of range. It should be between 0 and %d", api.FnMaxMemoryMB)
	errFnMemoryBelowFloor  = fnError(http.StatusBadRequest, "memory value is below Docker's floor of %d MB; send 0 for the default (%d) or at least %d", api.FnMinMemoryMB, api.FnDefaultMemoryMB, api.FnMinMemoryMB)
	errFnAppInvalidShape   = fnError(http.StatusBadRequest, "Invalid app shape")
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
	writeFnJSON(w, status, api.FnError{Message: message})
}

// fnJSONType is the Content-Type of every JSON body the Fn routes write,
// errors included, as Fn's router (gin) writes it.
const fnJSONType = "application/json; charset=utf-8"

// writeFnJSON answers with status and v as JSON, typed as Fn types it.
func writeFnJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", fnJSONType)
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the status is sent; a failed write is the caller's loss
}

// fnFail writes err in Fn's shape: an fnErr as it is, a failure kind by its
// status, anything else as Fn's internal error.
func (s *Service) fnFail(w http.ResponseWriter, err error) {
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

// appView is an app as reads show it.
func (s *Service) appView(a store.App) api.App {
	out := a.App
	out.SecretConfig = redactedSecrets(a.SealedConfig, a.SecretConfig)
	out.CreatedAt, out.UpdatedAt = fnTime(out.CreatedAt), fnTime(out.UpdatedAt)
	return out
}

// fnView is a function as reads show it, with Fn's invoke endpoint.
func (s *Service) fnView(f store.Fn) api.Fn {
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
func (s *Service) triggerView(t store.Trigger, appName string) api.Trigger {
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
