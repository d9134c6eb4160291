package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/function"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/internal/supervise"
	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// These tests drive the Functions API and the invoke path against fake
// nodes that speak the node protocol over HTTP (enroll, facts, session,
// the calls paths), so the control plane's side is tested without Docker:
// placement, spill, streaming both ways, node loss, deadlines, durable
// calls. The engine's side is fnagent's tests; the two together are the
// end-to-end tests in package e2e.

type pinResolver struct{}

func (pinResolver) Resolve(_ context.Context, ref string) (string, error) {
	if strings.Contains(ref, "missing") {
		return "", fmt.Errorf("no such image")
	}
	name, _, _ := strings.Cut(ref, ":")
	return name + "@sha256:" + strings.Repeat("a", 64), nil
}

type fnFixture struct {
	t *testing.T
	// skew moves the server's clock ahead of the wall clock (nanoseconds):
	// a test passes the life of the Functions caches without sleeping.
	skew atomic.Int64
	// frozen, when set, stops the server's clock at that moment: a test
	// reads the durations the server derives from it exactly.
	frozen atomic.Pointer[time.Time]
	srv    *Server
	st     store.Store
	http   *httptest.Server
	token  string
	tr     *nodeagent.HTTPTransport
}

func newFnFixture(t *testing.T) *fnFixture {
	st := memstore.New()
	key := bytes.Repeat([]byte{7}, RegistryKeySize)
	f := &fnFixture{t: t, st: st}
	h := httptest.NewUnstartedServer(nil) // its URL is the server's public one
	srv := New(Config{Lease: time.Minute, KeepAlive: 200 * time.Millisecond, RegistryKey: key, PublicURL: "http://" + h.Listener.Addr().String(),
		Now: f.now}, st, pinResolver{}, nil)
	h.Config.Handler = srv.Handler()
	h.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := srv.fn.StartAsync(ctx, supervise.Supervisor{})
	t.Cleanup(func() {
		cancel()
		<-done
		h.Close()
	})
	tok := "mca_" + httpapi.RandomToken()
	if err := st.Update(ctx, func(tx store.Tx) error {
		return tx.CreateToken(store.Token{Hash: httpapi.HashToken(tok), Name: "admin", CreatedAt: time.Now()})
	}); err != nil {
		t.Fatal(err)
	}
	f.srv, f.http, f.token, f.tr = srv, h, tok, nodeagent.NewHTTPTransport(h.URL, nil)
	return f
}

// now is the server's clock: the wall clock moved by skew, or frozen.
func (f *fnFixture) now() time.Time {
	if t := f.frozen.Load(); t != nil {
		return *t
	}
	return time.Now().Add(time.Duration(f.skew.Load()))
}

// do sends an API request and returns the status and body.
func (f *fnFixture) do(method, path string, body any, header ...string) (int, http.Header, []byte) {
	f.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	case io.Reader:
		r = b
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			f.t.Fatal(err)
		}
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, f.http.URL+path, r)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatalf("%s %s: reading: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, data
}

// want decodes a response of the wanted status into out.
func (f *fnFixture) want(status int, out any, method, path string, body any, header ...string) {
	f.t.Helper()
	got, _, data := f.do(method, path, body, header...)
	if got != status {
		f.t.Fatalf("%s %s = %d %s, want %d", method, path, got, data, status)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			f.t.Fatalf("%s %s: %v in %s", method, path, err, data)
		}
	}
}

// wantFnError checks Fn's error body and status.
func (f *fnFixture) wantFnError(status int, message, method, path string, body any) {
	f.t.Helper()
	got, _, data := f.do(method, path, body)
	var e api.FnError
	if got != status || json.Unmarshal(data, &e) != nil || !strings.Contains(e.Message, message) {
		f.t.Errorf("%s %s = %d %s, want %d {\"message\": %q}", method, path, got, data, status, message)
	}
}

func (f *fnFixture) deploy(appName string, fn api.Fn) (api.App, api.Fn) {
	f.t.Helper()
	var app api.App
	if status, _, data := f.do("GET", "/v2/apps?name="+appName, nil); status == 200 {
		var l api.AppList
		if err := json.Unmarshal(data, &l); err != nil {
			f.t.Fatalf("app list: %v: %s", err, data)
		}
		if len(l.Items) == 1 {
			app = l.Items[0]
		}
	}
	if app.ID == "" {
		f.want(200, &app, "POST", "/v2/apps", api.App{Name: appName})
	}
	fn.AppID = app.ID
	if fn.Image == "" {
		fn.Image = "registry.local/f:1"
	}
	var out api.Fn
	f.want(200, &out, "POST", "/v2/fns", fn)
	return app, out
}

// fakeNode is a node agent reduced to the protocol: it enrolls, reports a
// function share, holds a session, and answers each invoke with handle.
type fakeNode struct {
	f      *fnFixture
	id     string
	tok    string
	cancel context.CancelFunc
	done   chan struct{}
	handle func(n *fakeNode, inv nodeproto.InvokeCommand)
	got    atomic.Int64
	// logs are the call logs the node keeps, by call ID, and asked
	// counts the call_log commands it got (functions_logs_test.go).
	logs  sync.Map
	asked atomic.Int64
	// holds are the hold commands the node got (functions_warm_test.go).
	holds chan nodeproto.HoldCommand
	// endExpected is set by a test that ends the session from the server's
	// side on purpose (node rm); any other end is an error.
	endExpected atomic.Bool
}

func (f *fnFixture) startNode(id string, handle func(n *fakeNode, inv nodeproto.InvokeCommand)) *fakeNode {
	f.t.Helper()
	ctx := context.Background()
	inv := "mci_" + httpapi.RandomToken()
	if err := f.st.Update(ctx, func(tx store.Tx) error {
		if err := tx.PutNode(store.Node{ID: id, CreatedAt: time.Now()}); err != nil {
			return err
		}
		return tx.CreateInvitation(store.Invitation{TokenHash: httpapi.HashToken(inv), NodeID: id, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)})
	}); err != nil {
		f.t.Fatal(err)
	}
	e, err := f.tr.Enroll(ctx, nodeproto.EnrollmentRequest{NodeID: id, Invitation: inv, CapabilityVersion: nodeproto.Version})
	if err != nil {
		f.t.Fatal(err)
	}
	facts := nodeproto.NodeFacts{CapabilityVersion: nodeproto.Version, CPUs: 4, MemoryBytes: 8 << 30,
		Functions: &nodeproto.FunctionCapacity{MemoryBytes: 2 << 30, MilliCPUs: 1000}}
	if _, err := f.tr.SendEvents(ctx, id, e.SessionToken, []nodeproto.Event{{ID: "facts-1", Kind: nodeproto.EventFacts, At: time.Now(), Facts: &facts}}); err != nil {
		f.t.Fatal(err)
	}
	n := &fakeNode{f: f, id: id, tok: e.SessionToken, handle: handle, done: make(chan struct{}), holds: make(chan nodeproto.HoldCommand, 16)}
	n.start()
	f.t.Cleanup(n.stop)
	return n
}

func (n *fakeNode) start() {
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan struct{})
	cmds := make(chan nodeproto.Command)
	go func() {
		defer close(n.done)
		go func() {
			for {
				select {
				case cmd := <-cmds:
					if cmd.Kind == nodeproto.KindInvoke {
						n.got.Add(1)
						go n.handle(n, *cmd.Invoke)
					}
					if cmd.Kind == nodeproto.KindCallLog {
						n.asked.Add(1)
						go n.answerLog(*cmd.CallLog)
					}
					if cmd.Kind == nodeproto.KindHold {
						select {
						case n.holds <- *cmd.Hold:
						default: // a test that does not read them
						}
					}
				case <-ctx.Done():
					return
				}
			}
		}()
		// The session ends when the test stops the node; any other end
		// would leave the node deaf and the test waiting on it.
		if err := n.f.tr.Session(ctx, n.id, n.tok, cmds); err != nil && ctx.Err() == nil && !n.endExpected.Load() {
			n.f.t.Errorf("node %s's session ended: %v", n.id, err)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for n.f.srv.streams.Get(n.id) == nil {
		if time.Now().After(deadline) {
			n.f.t.Fatalf("node %s's session did not open", n.id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stop ends the session, as an agent's death does.
func (n *fakeNode) stop() {
	n.cancel()
	<-n.done
}

func (n *fakeNode) request(method string, inv nodeproto.InvokeCommand, suffix string, body io.Reader) *http.Request {
	req, err := http.NewRequest(method, inv.URL+nodeproto.PathCalls+inv.Rendezvous+suffix, body)
	if err != nil {
		// Only a bad method or URL fails here: the test's own mistake,
		// on a node's goroutine where t.Fatal may not be called.
		panic(err)
	}
	req.Header.Set(nodeproto.HeaderNodeID, n.id)
	req.Header.Set("Authorization", "Bearer "+n.tok)
	return req
}

// answer posts a whole response.
func (n *fakeNode) answer(inv nodeproto.InvokeCommand, status int, header http.Header, body string) int {
	req := n.request("POST", inv, "/response", strings.NewReader(body))
	req.Header.Set(nodeproto.HeaderCallStatus, strconv.Itoa(status))
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(nodeproto.HeaderCallHeader+k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// fail posts an error answer.
func (n *fakeNode) fail(inv nodeproto.InvokeCommand, kind, message string) int {
	req := n.request("POST", inv, "/response", strings.NewReader(message))
	req.Header.Set(nodeproto.HeaderCallError, kind)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// requestBody reads the call's body: inline, or streamed.
func (n *fakeNode) requestBody(inv nodeproto.InvokeCommand) []byte {
	if inv.BodyInline {
		return inv.Body
	}
	resp, err := http.DefaultClient.Do(n.request("GET", inv, "/request", nil))
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		n.f.t.Errorf("node %s reading a request body: %v", n.id, err)
	}
	return data
}

// echo answers with the request's body and a view of what it received.
func echo(n *fakeNode, inv nodeproto.InvokeCommand) {
	body := n.requestBody(inv)
	h := http.Header{"Content-Type": {"text/plain"}, "X-Node": {n.id}, "X-Call": {inv.CallID},
		"X-Method": inv.Header["Fn-Http-Method"], "X-Url": inv.Header["Fn-Http-Request-Url"], "X-Agent": inv.Header["Fn-Http-H-User-Agent"],
		"X-Auth":   {strings.Join(inv.Header["Authorization"], "") + strings.Join(inv.Header["Fn-Http-H-Authorization"], "")},
		"X-Secret": {inv.Function.Config["TOKEN"]}, "X-Config": {inv.Function.Config["A"] + inv.Function.Config["B"]},
		"X-Nowait": {strconv.FormatBool(inv.NoWait)}}
	n.answer(inv, 201, h, string(body))
}

func TestFunctionsAPIShapes(t *testing.T) {
	f := newFnFixture(t)

	// Apps: Fn's validation messages and codes.
	f.wantFnError(400, "Missing Name", "POST", "/v2/apps", api.App{})
	f.wantFnError(400, "Invalid app name", "POST", "/v2/apps", api.App{Name: "no spaces"})
	f.wantFnError(400, "App name must be 255 characters or less", "POST", "/v2/apps", api.App{Name: strings.Repeat("a", 256)})
	f.wantFnError(400, "App ID cannot be supplied on create", "POST", "/v2/apps", api.App{ID: "x", Name: "a"})
	f.wantFnError(400, "Invalid JSON", "POST", "/v2/apps", "{")
	f.wantFnError(400, "Invalid annotation key", "POST", "/v2/apps", map[string]any{"name": "a", "annotations": map[string]any{"has space": 1}})
	f.wantFnError(400, "Invalid annotation value", "POST", "/v2/apps", map[string]any{"name": "a", "annotations": map[string]any{"k": ""}})
	f.wantFnError(400, "invalid syslog url", "POST", "/v2/apps", map[string]any{"name": "a", "syslog_url": "http://x"})
	f.wantFnError(400, "Invalid config key", "POST", "/v2/apps", api.App{Name: "a", Config: map[string]string{"FN_FORMAT": "x"}})
	var app api.App
	f.want(200, &app, "POST", "/v2/apps", map[string]any{"name": "myapp", "config": map[string]string{"A": "1"},
		"secret_config": map[string]string{"TOKEN": "hunter2"}, "annotations": map[string]any{"team": "ml"}, "shape": "GENERIC_X86"})
	if app.ID == "" || app.Config["A"] != "1" || app.SecretConfig["TOKEN"] != api.SecretRedacted || string(app.Annotations["team"]) != `"ml"` {
		t.Fatalf("created app = %+v", app)
	}
	if app.CreatedAt.IsZero() || app.CreatedAt.Nanosecond()%int(time.Millisecond) != 0 {
		t.Errorf("created_at %v is not Fn's milliseconds", app.CreatedAt)
	}
	f.wantFnError(409, "App already exists", "POST", "/v2/apps", api.App{Name: "myapp"})
	f.wantFnError(404, "App not found", "GET", "/v2/apps/nope", nil)
	f.wantFnError(409, "Could not update - name is immutable", "PUT", "/v2/apps/"+app.ID, api.App{Name: "other"})
	f.wantFnError(400, "App ID in path does not match ID in body", "PUT", "/v2/apps/"+app.ID, api.App{ID: "other"})
	// An update merges config, deletes on empty values, and keeps a
	// redacted secret as it was.
	var updated api.App
	f.want(200, &updated, "PUT", "/v2/apps/"+app.ID, map[string]any{"config": map[string]string{"A": "", "C": "3"},
		"secret_config": map[string]string{"TOKEN": api.SecretRedacted}, "annotations": map[string]any{"team": ""}})
	if updated.Config["C"] != "3" || updated.Config["A"] != "" || updated.SecretConfig["TOKEN"] != api.SecretRedacted || updated.Annotations != nil {
		t.Errorf("updated app = %+v", updated)
	}
	err := f.st.View(context.Background(), func(tx store.Tx) error {
		a, err := tx.GetApp(app.ID)
		if err != nil {
			return err
		}
		// Sealed at rest bound to its owner and key name (the format
		// package function seals with, which stored values must keep).
		if got, err := (serverKey{f.srv}).Unseal([]byte("mercator secret config\x00app\x00"+a.ID+"\x00TOKEN"), a.SealedConfig["TOKEN"]); err != nil || got != "hunter2" {
			t.Errorf("stored secret = %q (%v), want it kept", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Paging: by name, cursor base64url, next_cursor only on a full page.
	for _, n := range []string{"b", "c", "d"} {
		f.want(200, nil, "POST", "/v2/apps", api.App{Name: n})
	}
	var page api.AppList
	f.want(200, &page, "GET", "/v2/apps?per_page=2", nil)
	if len(page.Items) != 2 || page.Items[0].Name != "b" || page.NextCursor == "" {
		t.Fatalf("page 1 = %+v", page)
	}
	var page2 api.AppList
	f.want(200, &page2, "GET", "/v2/apps?per_page=2&cursor="+page.NextCursor, nil)
	if len(page2.Items) != 2 || page2.Items[0].Name != "d" || page2.Items[1].Name != "myapp" {
		t.Fatalf("page 2 = %+v", page2)
	}

	// Functions.
	f.wantFnError(400, "Missing Fn name", "POST", "/v2/fns", api.Fn{AppID: app.ID, Image: "x:1"})
	f.wantFnError(400, "name must be a valid string", "POST", "/v2/fns", api.Fn{Name: "a/b", AppID: app.ID, Image: "x:1"})
	f.wantFnError(400, "Missing AppID on Fn", "POST", "/v2/fns", api.Fn{Name: "f", Image: "x:1"})
	f.wantFnError(400, "Missing image on Fn", "POST", "/v2/fns", api.Fn{Name: "f", AppID: app.ID})
	f.wantFnError(404, "App not found", "POST", "/v2/fns", api.Fn{Name: "f", AppID: "nope", Image: "x:1"})
	f.wantFnError(400, "timeout value is out of range", "POST", "/v2/fns", api.Fn{Name: "f", AppID: app.ID, Image: "x:1", Timeout: 301})
	f.wantFnError(400, "idle_timeout value is out of range", "POST", "/v2/fns", api.Fn{Name: "f", AppID: app.ID, Image: "x:1", IdleTimeout: 3601})
	f.wantFnError(400, "memory value is out of range", "POST", "/v2/fns", api.Fn{Name: "f", AppID: app.ID, Image: "x:1", Memory: 9000})
	f.wantFnError(400, "ID cannot be provided for Fn creation", "POST", "/v2/fns", api.Fn{ID: "x", Name: "f", AppID: app.ID, Image: "x:1"})
	f.wantFnError(400, "Invalid image", "POST", "/v2/fns", api.Fn{Name: "f", AppID: app.ID, Image: "missing:1"})
	var fn api.Fn
	f.want(200, &fn, "POST", "/v2/fns", map[string]any{"name": "hello", "app_id": app.ID, "image": "registry.local/hello:1",
		"config": map[string]string{"B": "2"}, "secret_config": map[string]string{"K": "v"}, "cpu": 0.25, "max_concurrency": 3, "format": "http-stream"})
	if fn.Memory != 128 || fn.Timeout != 30 || fn.IdleTimeout != 30 || !strings.Contains(fn.PinnedImage, "@sha256:") ||
		fn.SecretConfig["K"] != api.SecretRedacted || fn.CPU != 0.25 || fn.MaxConcurrency != 3 {
		t.Fatalf("created fn = %+v", fn)
	}
	if got := string(fn.Annotations[api.AnnotationInvokeEndpoint]); got != `"`+f.http.URL+"/invoke/"+fn.ID+`"` {
		t.Errorf("invoke endpoint annotation = %s", got)
	}
	f.wantFnError(409, "Fn with specified name already exists", "POST", "/v2/fns", api.Fn{Name: "hello", AppID: app.ID, Image: "x:1"})
	f.wantFnError(400, "Missing AppID on Fn", "GET", "/v2/fns", nil)
	var fns api.FnList
	f.want(200, &fns, "GET", "/v2/fns?app_id="+app.ID+"&name=hello", nil)
	if len(fns.Items) != 1 || fns.Items[0].ID != fn.ID {
		t.Errorf("fns by name = %+v", fns)
	}
	var fn2 api.Fn
	f.want(200, &fn2, "PUT", "/v2/fns/"+fn.ID, api.Fn{Memory: 256, Image: "registry.local/hello:2"})
	if fn2.Memory != 256 || fn2.Image != "registry.local/hello:2" || fn2.Timeout != 30 || fn2.Config["B"] != "2" || !fn2.UpdatedAt.After(fn.UpdatedAt.Add(-time.Millisecond)) {
		t.Errorf("updated fn = %+v", fn2)
	}
	f.wantFnError(400, "Fn names and IDs cannot be modified", "PUT", "/v2/fns/"+fn.ID, api.Fn{Name: "renamed"})
	f.wantFnError(400, "Fn ID in path does not match that in body", "PUT", "/v2/fns/"+fn.ID, api.Fn{ID: "other"})
	f.wantFnError(404, "Fn not found", "GET", "/v2/fns/nope", nil)

	// Triggers.
	f.wantFnError(400, "Trigger Type Not Supported", "POST", "/v2/triggers", api.Trigger{Name: "t", AppID: app.ID, FnID: fn.ID, Type: "cron", Source: "/x"})
	f.wantFnError(400, "Missing Trigger Source Prefix", "POST", "/v2/triggers", api.Trigger{Name: "t", AppID: app.ID, FnID: fn.ID, Type: "http", Source: "x"})
	f.wantFnError(400, "Missing name on Trigger", "POST", "/v2/triggers", api.Trigger{AppID: app.ID, FnID: fn.ID, Type: "http", Source: "/x"})
	f.wantFnError(404, "Fn not found", "POST", "/v2/triggers", api.Trigger{Name: "t", AppID: app.ID, FnID: "nope", Type: "http", Source: "/x"})
	var tr api.Trigger
	f.want(200, &tr, "POST", "/v2/triggers", api.Trigger{Name: "hello", AppID: app.ID, FnID: fn.ID, Type: "http", Source: "/hello"})
	if got := string(tr.Annotations[api.AnnotationTriggerEndpoint]); got != `"`+f.http.URL+"/t/myapp/hello"+`"` {
		t.Errorf("trigger endpoint annotation = %s", got)
	}
	f.wantFnError(409, "Trigger already exists", "POST", "/v2/triggers", api.Trigger{Name: "hello", AppID: app.ID, FnID: fn.ID, Type: "http", Source: "/other"})
	f.wantFnError(409, "Trigger with the same type and source exists on this app", "POST", "/v2/triggers", api.Trigger{Name: "other", AppID: app.ID, FnID: fn.ID, Type: "http", Source: "/hello"})
	var trs api.TriggerList
	f.want(200, &trs, "GET", "/v2/triggers?app_id="+app.ID+"&fn_id="+fn.ID, nil)
	if len(trs.Items) != 1 {
		t.Errorf("triggers = %+v", trs)
	}

	// Credentials: Fn-shaped 401 on every Fn route.
	req, err := http.NewRequest("GET", f.http.URL+"/v2/apps", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var fe api.FnError
	err = json.NewDecoder(resp.Body).Decode(&fe)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 401 || fe.Message == "" {
		t.Errorf("no credential = %d %+v %v", resp.StatusCode, fe, err)
	}

	// Deleting the app deletes its functions and triggers.
	f.want(204, nil, "DELETE", "/v2/apps/"+app.ID, nil)
	f.wantFnError(404, "Fn not found", "GET", "/v2/fns/"+fn.ID, nil)
	f.wantFnError(404, "Trigger not found", "GET", "/v2/triggers/"+tr.ID, nil)
}

func TestInvokeThroughNode(t *testing.T) {
	f := newFnFixture(t)
	f.startNode("n1", echo)
	app, fn := f.deploy("app", api.Fn{Name: "echo", Config: map[string]string{"B": "b"}, SecretConfig: map[string]string{"TOKEN": "s3"}})
	f.want(200, nil, "PUT", "/v2/apps/"+app.ID, api.App{Config: map[string]string{"A": "a"}})
	f.want(200, nil, "POST", "/v2/triggers", api.Trigger{Name: "echo", AppID: app.ID, FnID: fn.ID, Type: "http", Source: "/echo/me"})

	status, h, body := f.do("POST", "/invoke/"+fn.ID, "ping", "Content-Type", "text/plain")
	if status != 201 || string(body) != "ping" || h.Get("X-Node") != "n1" || h.Get("Fn-Call-Id") == "" || h.Get("Fn-Call-Id") != h.Get("X-Call") {
		t.Fatalf("invoke = %d %q %v", status, body, h)
	}
	if h.Get("X-Auth") != "" {
		t.Errorf("the function saw the credential: %q", h.Get("X-Auth"))
	}
	if h.Get("X-Secret") != "s3" || h.Get("X-Config") != "ab" {
		t.Errorf("the function's config: secret %q, config %q", h.Get("X-Secret"), h.Get("X-Config"))
	}
	if h.Get("X-Nowait") != "false" {
		t.Errorf("the only node was asked not to wait")
	}
	// Fn's trigger mapping.
	status, h, body = f.do("PUT", "/t/app/echo/me?x=1", "pong", "User-Agent", "tester")
	if status != 201 || string(body) != "pong" || h.Get("X-Method") != "PUT" || !strings.HasSuffix(h.Get("X-Url"), "/t/app/echo/me?x=1") || h.Get("X-Agent") != "tester" {
		t.Fatalf("trigger = %d %q %v", status, body, h)
	}
	if h.Get("X-Auth") != "" {
		t.Errorf("the function saw the credential through a trigger: %q", h.Get("X-Auth"))
	}
	f.wantFnError(404, "Trigger not found", "GET", "/t/app/nothing", nil)
	f.wantFnError(404, "App not found", "GET", "/t/nope/echo/me", nil)
	f.wantFnError(404, "Fn not found", "POST", "/invoke/nope", nil)
}

func TestInvokeErrorsMapToFn(t *testing.T) {
	f := newFnFixture(t)
	var kind atomic.Value
	f.startNode("n1", func(n *fakeNode, inv nodeproto.InvokeCommand) { n.fail(inv, kind.Load().(string), "detail") })
	_, fn := f.deploy("app", api.Fn{Name: "f"})
	for k, want := range map[string]int{"function_failed": 502, "timeout": 504, "container_init_timeout": 504, "request_too_big": 413, "busy": 503, "out_of_memory": 502} {
		kind.Store(k)
		status, h, body := f.do("POST", "/invoke/"+fn.ID, "x")
		var e api.FnError
		if err := json.Unmarshal(body, &e); err != nil {
			t.Errorf("%s: %v: %s", k, err, body)
		}
		if status != want || e.Kind != k || e.Detail != "detail" || e.Message == "" || h.Get("Fn-Call-Id") == "" {
			t.Errorf("%s: %d %s, want %d", k, status, body, want)
		}
	}
	// No node can hold a function too big for every share.
	_, big := f.deploy("app", api.Fn{Name: "big", Memory: 4096})
	status, _, body := f.do("POST", "/invoke/"+big.ID, "x")
	if status != 503 || !strings.Contains(string(body), "no_capacity") {
		t.Errorf("too big = %d %s", status, body)
	}
}

// TestInvokeInterimStatusIsNoAnswer: a node that passes on a function's
// informational status (1xx, an agent that predates its check) gets the
// call answered 502 invalid_response, not a 1xx followed by a 200 the
// function never chose.
func TestInvokeInterimStatusIsNoAnswer(t *testing.T) {
	f := newFnFixture(t)
	f.startNode("n1", func(n *fakeNode, inv nodeproto.InvokeCommand) {
		req := n.request("POST", inv, "/response", strings.NewReader("body"))
		req.Header.Set(nodeproto.HeaderCallStatus, "103")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	_, fn := f.deploy("app", api.Fn{Name: "f"})
	status, _, body := f.do("POST", "/invoke/"+fn.ID, "x")
	var e api.FnError
	if err := json.Unmarshal(body, &e); err != nil || status != http.StatusBadGateway || e.Kind != "invalid_response" || !strings.Contains(e.Detail, "103") {
		t.Fatalf("a 103 answer = %d %s (%v), want 502 invalid_response", status, body, err)
	}
}

// TestInvokeSpillsOnBusy: the function's first node in rendezvous order
// answers busy; the call moves to the next, told to wait there.
func TestInvokeSpillsOnBusy(t *testing.T) {
	f := newFnFixture(t)
	var busy sync.Map
	handle := func(n *fakeNode, inv nodeproto.InvokeCommand) {
		if _, ok := busy.Load(n.id); ok {
			n.fail(inv, "busy", "full")
			return
		}
		echo(n, inv)
	}
	n1, n2 := f.startNode("n1", handle), f.startNode("n2", handle)
	_, fn := f.deploy("app", api.Fn{Name: "f"})
	order := scheduler.PlaceFunction(fn.ID, []scheduler.FunctionNode{{ID: "n1", Share: nodeproto.FunctionCapacity{MemoryBytes: 1 << 30}}, {ID: "n2", Share: nodeproto.FunctionCapacity{MemoryBytes: 1 << 30}}}, scheduler.FunctionNeed{MemoryBytes: 128 << 20})
	first, second := n1, n2
	if order[0].ID == "n2" {
		first, second = n2, n1
	}
	// Consistent: every call goes to the first node while it has room.
	for i := 0; i < 5; i++ {
		if _, h, _ := f.do("POST", "/invoke/"+fn.ID, "x"); h.Get("X-Node") != first.id {
			t.Fatalf("call %d went to %s, want %s", i, h.Get("X-Node"), first.id)
		}
	}
	busy.Store(first.id, true)
	status, h, body := f.do("POST", "/invoke/"+fn.ID, "spilled")
	if status != 201 || h.Get("X-Node") != second.id || string(body) != "spilled" || h.Get("X-Nowait") != "false" {
		t.Fatalf("spilled call = %d %q %v", status, body, h)
	}
	// The busy node was offered the call without waiting.
	if first.got.Load() != 6 {
		t.Errorf("first node got %d calls, want 6", first.got.Load())
	}
}

// TestInvokeStreamsBothWays: a body larger than what travels inline is
// streamed to the node as it reads it, and the response reaches the caller
// chunk by chunk while the node still writes it.
func TestInvokeStreamsBothWays(t *testing.T) {
	f := newFnFixture(t)
	firstChunkSeen := make(chan struct{})
	f.startNode("n1", func(n *fakeNode, inv nodeproto.InvokeCommand) {
		if inv.BodyInline {
			n.fail(inv, "invalid", "a large body came inline")
			return
		}
		body := n.requestBody(inv)
		pr, pw := io.Pipe()
		go func() {
			if _, err := pw.Write([]byte(fmt.Sprintf("got %d bytes;", len(body)))); err != nil {
				pw.CloseWithError(err)
				return
			}
			// The rest only once the caller has the first chunk: a
			// control plane that buffered the response would deadlock
			// here, and the test would time out.
			select {
			case <-firstChunkSeen:
			case <-time.After(10 * time.Second):
			}
			_, err := pw.Write([]byte("rest"))
			pw.CloseWithError(err)
		}()
		req := n.request("POST", inv, "/response", pr)
		req.Header.Set(nodeproto.HeaderCallStatus, "200")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
	})
	_, fn := f.deploy("app", api.Fn{Name: "f"})
	big := bytes.Repeat([]byte("x"), function.InlineBody*3+7)
	req, err := http.NewRequest("POST", f.http.URL+"/invoke/"+fn.ID, bytes.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	n, err := io.ReadAtLeast(resp.Body, buf, len(fmt.Sprintf("got %d bytes;", len(big))))
	if got := string(buf[:n]); err != nil || got != fmt.Sprintf("got %d bytes;", len(big)) {
		t.Fatalf("first chunk = %q, %v", got, err)
	}
	close(firstChunkSeen)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "rest" {
		t.Errorf("rest = %q, %v", rest, err)
	}
}

// TestInvokeNodeLost: a node whose session ends during a call fails the
// call at once (not at its deadline); a node that stops answering fails it
// at the deadline; neither hangs the caller.
func TestInvokeNodeLost(t *testing.T) {
	f := newFnFixture(t)
	received := make(chan struct{}, 1)
	n1 := f.startNode("n1", func(n *fakeNode, inv nodeproto.InvokeCommand) { received <- struct{}{} })
	_, fn := f.deploy("app", api.Fn{Name: "f", Timeout: 30})
	go func() {
		<-received
		n1.stop()
	}()
	// Bounds are the property, not a figure for a quiet machine: the lost
	// node's call ends before its 30 s deadline could, and the silent
	// node's at its 1 s deadline (a timer never fires early), not hung.
	start := time.Now()
	status, _, body := f.do("POST", "/invoke/"+fn.ID, "x")
	if status != 502 || !strings.Contains(string(body), "node_lost") || time.Since(start) >= 30*time.Second {
		t.Fatalf("call on a lost node = %d %s after %v", status, body, time.Since(start))
	}

	f.startNode("n2", func(n *fakeNode, inv nodeproto.InvokeCommand) {}) // never answers
	_, slow := f.deploy("app", api.Fn{Name: "slow", Timeout: 1})
	start = time.Now()
	status, _, body = f.do("POST", "/invoke/"+slow.ID, "x")
	if took := time.Since(start); status != 504 || took < time.Second || took >= 30*time.Second {
		t.Fatalf("call on a silent node = %d %s after %v, want a timeout at the 1 s deadline", status, body, took)
	}
}

// TestDurableCallDeliveredAgainAfterNodeLoss: a detached call is stored,
// its first node is lost during the call, and it is delivered again, with
// the same call ID, to another node; its result and log are kept.
func TestDurableCallDeliveredAgainAfterNodeLoss(t *testing.T) {
	f := newFnFixture(t)
	var n1 *fakeNode
	lost := make(chan string, 1)
	var seen sync.Map
	handler := func(n *fakeNode, inv nodeproto.InvokeCommand) {
		seen.Store(n.id, inv.CallID)
		if n == n1 {
			lost <- inv.CallID
			return
		}
		if !inv.Logs {
			n.fail(inv, "invalid", "a durable call must ask for its log")
			return
		}
		n.answer(inv, 200, http.Header{"Content-Type": {"application/json"}}, `{"ok":true}`)
		req := n.request("POST", inv, "/log", strings.NewReader("hello from "+n.id+"\n"))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	n1 = f.startNode("n1", handler)
	_, fn := f.deploy("app", api.Fn{Name: "f", Timeout: 5})
	var dc api.DetachedCall
	f.want(202, &dc, "POST", "/invoke/"+fn.ID, `{"x":1}`, "Fn-Invoke-Type", "detached")
	if dc.CallID == "" {
		t.Fatal("no call ID")
	}
	var call api.FnCall
	f.want(200, &call, "GET", "/v2/fns/"+fn.ID+"/calls/"+dc.CallID, nil)
	if call.Status != api.CallQueued && call.Status != api.CallRunning {
		t.Errorf("fresh call = %+v", call)
	}
	select {
	case id := <-lost:
		if id != dc.CallID {
			t.Fatalf("the node saw call %s, want %s", id, dc.CallID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call was never delivered")
	}
	f.startNode("n2", handler)
	n1.stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		f.want(200, &call, "GET", "/v2/fns/"+fn.ID+"/calls/"+dc.CallID, nil)
		if call.Status == api.CallSuccess || call.Status == api.CallError {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("call still %+v", call)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if call.Status != api.CallSuccess || call.Attempts != 2 || call.NodeID != "n2" || call.ResponseStatus != 200 || call.CompletedAt == nil {
		t.Fatalf("call = %+v", call)
	}
	if id, _ := seen.Load("n2"); id != dc.CallID {
		t.Errorf("the second delivery carried call ID %v, want %s", id, dc.CallID)
	}
	status, h, body := f.do("GET", "/v2/fns/"+fn.ID+"/calls/"+dc.CallID+"/result", nil)
	if status != 200 || string(body) != `{"ok":true}` || h.Get("Content-Type") != "application/json" {
		t.Errorf("result = %d %q %v", status, body, h)
	}
	var lr api.CallLogResponse
	f.want(200, &lr, "GET", "/v2/fns/"+fn.ID+"/calls/"+dc.CallID+"/log", nil, "Accept", "application/json")
	if lr.Log.Log != "hello from n2\n" || lr.Log.CallID != dc.CallID {
		t.Errorf("log = %+v", lr)
	}
	if _, _, text := f.do("GET", "/v2/fns/"+fn.ID+"/calls/"+dc.CallID+"/log", nil); string(text) != "hello from n2\n" {
		t.Errorf("text log = %q", text)
	}
	var calls api.FnCallList
	f.want(200, &calls, "GET", "/v2/fns/"+fn.ID+"/calls", nil)
	if len(calls.Items) != 1 || calls.Items[0].ID != dc.CallID {
		t.Errorf("calls = %+v", calls)
	}
}

// TestFunctionShareReservedFromRuns: a node's function share is not
// offered to Runs.
func TestFunctionShareReservedFromRuns(t *testing.T) {
	f := newFnFixture(t)
	f.startNode("n1", echo)
	var snap struct {
		used int64
		cap  int64
	}
	err := f.st.View(context.Background(), func(tx store.Tx) error {
		s, _, err := f.srv.snapshot(tx)
		for _, n := range s.Nodes {
			if n.ID == "n1" {
				snap.used, snap.cap = n.UsedMemory, n.MemoryBytes
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if snap.used != 2<<30 || snap.cap != 8<<30 {
		t.Errorf("scheduler sees %d of %d bytes used, want the 2 GiB share counted", snap.used, snap.cap)
	}
}

// TestInvokeDeadlineEndToEnd: the node is given what is left of the
// call's deadline, the function's timeout or the caller's own Fn-Deadline,
// whichever is sooner.
func TestInvokeDeadlineEndToEnd(t *testing.T) {
	f := newFnFixture(t)
	f.startNode("n1", func(n *fakeNode, inv nodeproto.InvokeCommand) {
		n.answer(inv, 200, http.Header{"X-Timeout": {strconv.FormatInt(inv.Timeout.Milliseconds(), 10)}}, "")
	})
	_, fn := f.deploy("app", api.Fn{Name: "f", Timeout: 20})
	// The server's clock stands still, so what is left is exact: no
	// window for the time the request took.
	now := time.Now()
	f.frozen.Store(&now)
	_, h, _ := f.do("POST", "/invoke/"+fn.ID, "")
	if ms, err := strconv.Atoi(h.Get("X-Timeout")); err != nil || ms != 20000 {
		t.Errorf("the node was given %d ms (%v), want the function's 20 s", ms, err)
	}
	_, h, _ = f.do("POST", "/invoke/"+fn.ID, "", "Fn-Deadline", now.Add(3*time.Second).UTC().Format(time.RFC3339Nano))
	if ms, err := strconv.Atoi(h.Get("X-Timeout")); err != nil || ms != 3000 {
		t.Errorf("the node was given %d ms (%v), want the caller's 3 s", ms, err)
	}
}
