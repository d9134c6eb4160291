package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
)

// The Fn toolchain end to end (issue 19): the HTTP calls the Fn CLI 0.6.63
// makes for each command of a user's journey, in its order, against a real
// control plane and agent, each step's status and body checked against what
// Fn's server answers. The CLI sends its context's token on the management
// routes and none when it invokes (`fn invoke`), as web hooks send none to
// triggers.

// fnStep is one HTTP call of the journey.
type fnStep struct {
	t     *testing.T
	base  string
	token string
}

// do sends a request as the Fn CLI does (JSON, its User-Agent, the token
// when given) and returns the status, headers and body.
func (s fnStep) do(method, path, token string, header http.Header, body string) (int, http.Header, []byte) {
	s.t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	target := path
	if !strings.HasPrefix(path, "http") {
		target = s.base + path
	}
	req, err := http.NewRequest(method, target, r)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("User-Agent", "Fn-Client/0.6.63")
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range header {
		req.Header[k] = vs
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("%s %s: reading: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, raw
}

// api is a management call with the context's token: want is the status
// Fn answers; the body is decoded into out when given.
func (s fnStep) api(what, method, path, body string, want int, out any) {
	s.t.Helper()
	status, _, raw := s.do(method, path, s.token, nil, body)
	if status != want {
		s.t.Fatalf("%s: %s %s = %d %s; Fn answers %d", what, method, path, status, raw, want)
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			s.t.Fatalf("%s: %v in %s", what, err, raw)
		}
	}
}

// fnErr checks an error answer: Fn's status, message and Content-Type.
func (s fnStep) fnErr(what string, status int, h http.Header, raw []byte, wantStatus int, message string) {
	s.t.Helper()
	var e api.FnError
	if status != wantStatus || json.Unmarshal(raw, &e) != nil || !strings.Contains(e.Message, message) ||
		h.Get("Content-Type") != "application/json; charset=utf-8" {
		s.t.Errorf("%s = %d %q %s; Fn answers %d {\"message\": %q} as application/json; charset=utf-8",
			what, status, h.Get("Content-Type"), raw, wantStatus, message)
	}
}

func TestFnToolchainJourney(t *testing.T) {
	c := startCluster(t)
	c.startAgent("n")
	hello := c.publish("fn-hello")
	raw := c.publish("fn-raw")
	s := fnStep{t: t, base: c.url, token: c.token}

	// fn version: GET /version ("Server version").
	var v map[string]string
	s.api("fn version", "GET", "/version", "", 200, &v)
	if v["version"] == "" {
		t.Errorf("/version = %v", v)
	}

	// fn create app journey --shape GENERIC_X86
	var app api.App
	s.api("fn create app", "POST", "/v2/apps", `{"name":"journey","shape":"GENERIC_X86"}`, 200, &app)
	// fn list apps; fn inspect app journey shape (by name).
	var apps api.AppList
	s.api("fn inspect app", "GET", "/v2/apps?name=journey", "", 200, &apps)
	if len(apps.Items) != 1 || apps.Items[0].Shape != "GENERIC_X86" {
		t.Fatalf("fn inspect app journey shape: %+v", apps)
	}

	// fn create function journey hello IMAGE (the CLI sends fields of its
	// own; the server ignores those it does not know).
	var fn api.Fn
	s.api("fn create function", "POST", "/v2/fns",
		`{"name":"hello","app_id":"`+app.ID+`","image":"`+hello+`","memory":128,"timeout":30,"idle_timeout":30,"annotations":{},"format":"http-stream"}`, 200, &fn)
	// fn list functions without an app: the CLI asks with no app_id, and
	// Fn's server refuses.
	status, h, body := s.do("GET", "/v2/fns", c.token, nil, "")
	s.fnErr("fn list functions (no app)", status, h, body, 400, "Missing AppID on Fn")
	var fns api.FnList
	s.api("fn list functions journey", "GET", "/v2/fns?app_id="+app.ID, "", 200, &fns)
	if len(fns.Items) != 1 || fns.Items[0].ID != fn.ID {
		t.Fatalf("fn list functions journey: %+v", fns)
	}
	// fn config function journey hello GREETING hi; fn inspect config.
	var updated api.Fn
	s.api("fn config function", "PUT", "/v2/fns/"+fn.ID, `{"config":{"GREETING":"hi"}}`, 200, &updated)
	if updated.Config["GREETING"] != "hi" {
		t.Errorf("fn config function: %+v", updated.Config)
	}
	// fn create trigger journey hello hook --type http --source /hook
	var tr api.Trigger
	s.api("fn create trigger", "POST", "/v2/triggers",
		`{"name":"hook","app_id":"`+app.ID+`","fn_id":"`+fn.ID+`","type":"http","source":"/hook"}`, 200, &tr)
	endpoint := jsonString(t, fn.Annotations[api.AnnotationInvokeEndpoint])
	hook := jsonString(t, tr.Annotations[api.AnnotationTriggerEndpoint])

	// fn invoke journey hello: the CLI sends no credential. Closed by
	// default: Fn's error shape, and a message that says how to open it.
	status, h, body = s.do("POST", endpoint, "", nil, `{"name":"anon"}`)
	s.fnErr("fn invoke (app not public)", status, h, body, 401, "--public-invoke")
	// With a credential (curl, client libraries) it works as ever, and
	// the FDK's own headers come back on a direct invoke.
	status, h, body = s.do("POST", endpoint, c.token, nil, `{"name":"token"}`)
	if status != 200 || !strings.Contains(string(body), "Hello, token") || h.Get("Fn-Call-Id") == "" {
		t.Fatalf("invoke with a credential = %d %q %v", status, body, h)
	}

	// fn update app journey --annotation mercator.dev/public-invoke='"true"'
	var opened api.App
	s.api("fn update app (public)", "PUT", "/v2/apps/"+app.ID, `{"annotations":{"`+api.AnnotationPublicInvoke+`":"true"}}`, 200, &opened)
	if jsonString(t, opened.Annotations[api.AnnotationPublicInvoke]) != "true" {
		t.Errorf("the app read does not show it public: %s", opened.Annotations)
	}
	status, h, body = s.do("POST", endpoint, "", nil, `{"name":"fn invoke"}`)
	if status != 200 || !strings.Contains(string(body), "Hello, fn invoke") || h.Get("Fn-Call-Id") == "" {
		t.Fatalf("fn invoke without a credential, app public = %d %q %v", status, body, h)
	}
	// A web hook: the trigger without a credential. Fn passes back only
	// the gateway headers (unwrapped), Content-Type and Fn-Call-Id.
	status, h, body = s.do("POST", hook, "", nil, `{"name":"hook"}`)
	if status != 200 || !strings.Contains(string(body), "Hello, hook") || h.Get("Fn-Call-Id") == "" ||
		h.Get("Content-Type") != "application/json" || h.Get("Fn-Fdk-Version") != "" || h.Get("Fn-Fdk-Runtime") != "" {
		t.Fatalf("trigger without a credential = %d %q %v", status, body, h)
	}

	// Wrong method on /invoke/{id}; an unknown path under /v2.
	status, h, body = s.do("PUT", endpoint, "", nil, "")
	s.fnErr("PUT /invoke/{id}", status, h, body, 405, "Method not allowed")
	status, h, body = s.do("GET", "/v2/nothing", c.token, nil, "")
	s.fnErr("GET /v2/nothing", status, h, body, 404, "Path not found")

	// A function that crashes during a call: Fn's 502.
	var crasher api.Fn
	s.api("fn create function (raw)", "POST", "/v2/fns", `{"name":"raw","app_id":"`+app.ID+`","image":"`+raw+`"}`, 200, &crasher)
	status, h, body = s.do("POST", "/invoke/"+url.PathEscape(crasher.ID), "", http.Header{"X-Test": {"crash"}}, "")
	s.fnErr("a crash during the call", status, h, body, 502, "error receiving function response")

	// fn delete trigger / function / app; then the app is gone, and its
	// invoke endpoint answers Fn's 404 to anyone.
	s.api("fn delete trigger", "DELETE", "/v2/triggers/"+tr.ID, "", 204, nil)
	s.api("fn delete function", "DELETE", "/v2/fns/"+fn.ID, "", 204, nil)
	s.api("fn delete function (raw)", "DELETE", "/v2/fns/"+crasher.ID, "", 204, nil)
	s.api("fn delete app", "DELETE", "/v2/apps/"+app.ID, "", 204, nil)
	status, h, body = s.do("POST", endpoint, "", nil, "")
	s.fnErr("invoke after delete", status, h, body, 404, "Fn not found")
}

// jsonString is a JSON string annotation's value.
func jsonString(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("annotation %s: %v", raw, err)
	}
	return s
}
