package controlplane

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/function"
	"github.com/mercator/mercator/nodeproto"
)

// TestFnCompatAnswers: the answers issue 19 found different from Fn's, each
// as Fn's server gives it (api/server, api/models of fnproject/fn 0.3.753).
func TestFnCompatAnswers(t *testing.T) {
	f := newFnFixture(t)
	// /version needs no credential and answers Fn's shape.
	status, body := callAs(t, f, "", "GET", "/version", nil)
	var v map[string]string
	if status != 200 || json.Unmarshal(body, &v) != nil || v["version"] != function.FnVersion {
		t.Errorf("/version = %d %s", status, body)
	}
	// Unknown paths and wrong methods under the Fn routes: Fn's words,
	// Fn's shape, Fn's Content-Type.
	for _, c := range []struct {
		method, path string
		status       int
		message      string
	}{
		{"PUT", "/invoke/fn-x", 405, "Method not allowed: PUT /invoke/fn-x"},
		{"GET", "/invoke/fn-x", 405, "Method not allowed: GET /invoke/fn-x"},
		{"PATCH", "/v2/apps", 405, "Method not allowed"},
		{"GET", "/v2/nothing", 404, "Path not found: GET /v2/nothing"},
	} {
		status, h, body := f.do(c.method, c.path, nil)
		var e api.FnError
		if status != c.status || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Message, c.message) || h.Get("Content-Type") != "application/json; charset=utf-8" {
			t.Errorf("%s %s = %d %v %s; want %d %q", c.method, c.path, status, h.Get("Content-Type"), body, c.status, c.message)
		}
	}
	// Validation in Fn's order and words.
	var app api.App
	f.want(200, &app, "POST", "/v2/apps", api.App{Name: "a", Shape: "GENERIC_X86"})
	if app.Shape != "GENERIC_X86" {
		t.Errorf("app shape = %q", app.Shape)
	}
	var got api.App
	f.want(200, &got, "GET", "/v2/apps/"+app.ID, nil)
	if got.Shape != "GENERIC_X86" {
		t.Errorf("app shape read back = %q", got.Shape)
	}
	f.wantFnError(400, "Invalid app shape", "POST", "/v2/apps", api.App{Name: "b", Shape: "Z80"})
	f.wantFnError(400, "Missing AppID on Fn", "POST", "/v2/fns", api.Fn{Image: "x:1"})
	f.wantFnError(400, "Missing AppID on Fn", "GET", "/v2/fns", nil)
	f.wantFnError(400, "Missing App ID on Trigger", "GET", "/v2/triggers", nil)
	f.wantFnError(400, "It should be between 0 and 8192", "POST", "/v2/fns", api.Fn{Name: "f", AppID: app.ID, Image: "registry.local/f:1", Memory: 9000})
	f.wantFnError(400, "below Docker's floor of 6 MB", "POST", "/v2/fns", api.Fn{Name: "f", AppID: app.ID, Image: "registry.local/f:1", Memory: 3})
	f.wantFnError(400, "must be pushed to a registry the nodes can reach", "POST", "/v2/fns", api.Fn{Name: "f", AppID: app.ID, Image: "missing:1"})
	var fn api.Fn
	f.want(200, &fn, "POST", "/v2/fns", api.Fn{Name: "f", AppID: app.ID, Image: "registry.local/f:1", Memory: 0, Shape: "GENERIC_X86"})
	if fn.Memory != api.FnDefaultMemoryMB || fn.Shape != "GENERIC_X86" {
		t.Errorf("fn = memory %d shape %q; want the default memory and the shape kept", fn.Memory, fn.Shape)
	}

	// How calls that got no response end: Fn's status and message.
	var kind atomic.Value
	f.startNode("n1", func(n *fakeNode, inv nodeproto.InvokeCommand) { n.fail(inv, kind.Load().(string), "detail") })
	for k, want := range map[string]struct {
		status  int
		message string
	}{
		"no_response":      {502, "error receiving function response"},
		"out_of_memory":    {502, "error receiving function response"},
		"function_failed":  {502, "function failed"},
		"invalid_response": {502, "invalid function response"},
		"capacity_timeout": {503, "Timed out - server too busy"},
	} {
		kind.Store(k)
		status, h, body := f.do("POST", "/invoke/"+fn.ID, "x")
		var e api.FnError
		if status != want.status || json.Unmarshal(body, &e) != nil || e.Message != want.message || e.Kind != k ||
			h.Get("Content-Type") != "application/json; charset=utf-8" || h.Get("Fn-Call-Id") == "" {
			t.Errorf("%s: %d %v %s; want %d %q", k, status, h, body, want.status, want.message)
		}
	}
}

// TestPublicInvoke: an app or a trigger is opened to callers without a
// credential only explicitly, every read shows it, the audit log records
// the change, and closing it again refuses them.
func TestPublicInvoke(t *testing.T) {
	f := newFnFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.srv.audit.Run(ctx) }()
	f.startNode("n1", echo)
	app, fn := f.deploy("web", api.Fn{Name: "echo"})
	_, other := f.deploy("private", api.Fn{Name: "echo"})
	f.want(200, nil, "POST", "/v2/triggers", api.Trigger{Name: "hook", AppID: app.ID, FnID: fn.ID, Type: "http", Source: "/hook"})

	anon := func(method, path string) (int, api.FnError) {
		t.Helper()
		status, body := callAs(t, f, "", method, path, "ping")
		var e api.FnError
		if status >= 300 {
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("%s %s = %d %s: not Fn's error shape", method, path, status, body)
			}
		}
		return status, e
	}
	// Closed by default, with a message that says how to open it.
	if status, e := anon("POST", "/invoke/"+fn.ID); status != 401 || !strings.Contains(e.Message, "--public-invoke") {
		t.Fatalf("anonymous invoke of a closed app = %d %q", status, e.Message)
	}
	if status, _ := anon("POST", "/t/web/hook"); status != 401 {
		t.Fatalf("anonymous trigger call of a closed app = %d", status)
	}

	// Opened, as the Fn CLI opens it: an annotation on the app.
	var opened api.App
	f.want(200, &opened, "PUT", "/v2/apps/"+app.ID, map[string]any{"annotations": map[string]any{function.PublicInvokeAnnotation: "true"}})
	if string(opened.Annotations[function.PublicInvokeAnnotation]) != `"true"` {
		t.Errorf("the update does not show the app public: %s", opened.Annotations)
	}
	if status, _ := anon("POST", "/invoke/"+fn.ID); status != 201 {
		t.Errorf("anonymous invoke of a public app = %d", status)
	}
	if status, _ := anon("POST", "/t/web/hook"); status != 201 {
		t.Errorf("anonymous trigger call of a public app = %d", status)
	}
	// Another app stays closed.
	if status, _ := anon("POST", "/invoke/"+other.ID); status != 401 {
		t.Errorf("anonymous invoke of another app = %d", status)
	}

	// Closed again; then one trigger opened on its own.
	f.want(200, nil, "PUT", "/v2/apps/"+app.ID, map[string]any{"annotations": map[string]any{function.PublicInvokeAnnotation: ""}})
	if status, _ := anon("POST", "/invoke/"+fn.ID); status != 401 {
		t.Errorf("anonymous invoke after closing = %d", status)
	}
	var list api.TriggerList
	f.want(200, &list, "GET", "/v2/triggers?app_id="+app.ID, nil)
	f.want(200, nil, "PUT", "/v2/triggers/"+list.Items[0].ID, map[string]any{"annotations": map[string]any{function.PublicInvokeAnnotation: "true"}})
	if status, _ := anon("GET", "/t/web/hook"); status != 201 {
		t.Errorf("anonymous call of a public trigger = %d", status)
	}
	if status, _ := anon("POST", "/invoke/"+fn.ID); status != 401 {
		t.Errorf("a public trigger opened its function's invoke: %d", status)
	}

	cancel()
	<-done
	var audit api.AuditList
	f.want(200, &audit, "GET", "/v1/audit", nil)
	details := map[string]bool{}
	for _, e := range audit.Entries {
		if e.Detail != "" {
			details[e.Route+" "+e.Detail] = true
		}
	}
	for _, want := range []string{
		"PUT /v2/apps/{app_id} app web public invoke on",
		"PUT /v2/apps/{app_id} app web public invoke off",
		"PUT /v2/triggers/{trigger_id} trigger hook public invoke on",
	} {
		if !details[want] {
			t.Errorf("the audit log lacks %q: %v", want, details)
		}
	}
}
