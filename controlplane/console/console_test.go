package console

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
)

// fakeAPI is the control plane as the console sees it, in memory; it
// records the changes asked of it.
type fakeAPI struct {
	nodes     []api.Node
	runs      []api.Run
	cancelled []string
	cordoned  []string
	pages     []client.NodePageOptions
	queue     []string // run IDs in scheduling order (?queue=1); empty off the scheduling replica
}

func (f *fakeAPI) ListNodes(context.Context) (api.NodeList, error) {
	return api.NodeList{Nodes: f.nodes}, nil
}

// ListNodesPage pages f.nodes (kept in ID order by the tests) and counts
// them as the control plane's summary would.
func (f *fakeAPI) ListNodesPage(_ context.Context, o client.NodePageOptions) (api.NodeList, error) {
	f.pages = append(f.pages, o)
	out := api.NodeList{Summary: &api.FleetSummary{Nodes: map[string]int{}, GPUs: map[string]int{}}}
	for _, n := range f.nodes {
		out.Summary.Nodes[n.Status]++
		out.Summary.GPUs["busy"] += len(n.GPUsInUse)
		if n.ID > o.After && len(out.Nodes) < o.Limit {
			out.Nodes = append(out.Nodes, n)
		}
		out.Summary.Matching++
	}
	if len(out.Nodes) == o.Limit {
		out.Next = out.Nodes[o.Limit-1].ID
	}
	return out, nil
}
func (f *fakeAPI) GetNode(_ context.Context, id string) (api.Node, error) {
	for _, n := range f.nodes {
		if n.ID == id {
			return n, nil
		}
	}
	return api.Node{}, failure.NotFound("node", id)
}
func (f *fakeAPI) CordonNode(_ context.Context, id string) (api.Node, error) {
	f.cordoned = append(f.cordoned, id)
	return api.Node{ID: id}, nil
}
func (f *fakeAPI) UncordonNode(_ context.Context, id string) (api.Node, error) {
	return api.Node{ID: id}, nil
}
func (f *fakeAPI) DrainNode(_ context.Context, id string, _ time.Duration) (api.Node, error) {
	return api.Node{ID: id}, nil
}
func (f *fakeAPI) ListRuns(_ context.Context, o client.ListRunsOptions) (api.RunList, error) {
	var out []api.Run
	if o.Queue {
		for i, id := range f.queue {
			r, _ := f.GetRun(context.Background(), id)
			r.Queue = &api.QueuePosition{Project: "default", Position: i + 1, Of: len(f.queue)}
			out = append(out, r)
		}
		return api.RunList{Runs: out}, nil
	}
	for _, r := range f.runs {
		if len(o.Statuses) == 0 || strings.Contains(strings.Join(o.Statuses, ","), r.Status) {
			out = append(out, r)
		}
	}
	return api.RunList{Runs: out}, nil
}
func (f *fakeAPI) GetRun(_ context.Context, id string) (api.Run, error) {
	for _, r := range f.runs {
		if r.ID == id {
			return r, nil
		}
	}
	return api.Run{}, failure.NotFound("run", id)
}
func (f *fakeAPI) WaitRunFunc(ctx context.Context, id string, observe func(api.Run)) (api.Run, error) {
	r, err := f.GetRun(ctx, id)
	if err == nil {
		r.Status = api.RunSucceeded // the run ends as its log does
		observe(r)
	}
	return r, err
}
func (f *fakeAPI) SubmitRun(_ context.Context, spec api.RunSpec, _ ...client.SubmitOption) (api.Run, error) {
	r := api.Run{ID: "r-new", RunSpec: spec, Status: api.RunQueued}
	f.runs = append(f.runs, r)
	return r, nil
}
func (f *fakeAPI) CancelRun(_ context.Context, id string) (api.Run, error) {
	f.cancelled = append(f.cancelled, id)
	return api.Run{ID: id}, nil
}
func (f *fakeAPI) Logs(_ context.Context, _ string, _ bool, w io.Writer) error {
	_, err := io.WriteString(w, "one\ntwo\r\nthree")
	return err
}
func (f *fakeAPI) ListApps(context.Context) ([]api.App, error) { return nil, nil }
func (f *fakeAPI) ListFns(context.Context, string) ([]api.Fn, error) {
	return nil, nil
}
func (f *fakeAPI) ListTriggers(context.Context, string, string) ([]api.Trigger, error) {
	return nil, nil
}
func (f *fakeAPI) GetFn(_ context.Context, id string) (api.Fn, error) {
	return api.Fn{ID: id, Name: "resize", AppID: "app-1", Image: "img@sha256:1"}, nil
}
func (f *fakeAPI) ListCalls(_ context.Context, fnID string, perPage int) (api.FnCallList, error) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	started, done := created.Add(250*time.Millisecond), created.Add(1250*time.Millisecond)
	return api.FnCallList{Items: []api.FnCall{
		{ID: "call-2", FnID: fnID, Status: api.CallQueued, CreatedAt: created},
		{ID: "call-1", FnID: fnID, Status: "success", ResponseStatus: 200, CreatedAt: created, StartedAt: &started, CompletedAt: &done},
	}}, nil
}
func (f *fakeAPI) CallLog(_ context.Context, fnID, callID string) (string, error) {
	return "resized <b>3</b> images\n", nil
}
func (f *fakeAPI) ListArtifacts(context.Context, string) (api.ArtifactList, error) {
	return api.ArtifactList{}, nil
}
func (f *fakeAPI) ListAudit(context.Context, client.AuditOptions) (api.AuditList, error) {
	return api.AuditList{}, nil
}

// fakeAuth knows tokens by secret; removing one is deleting it.
type fakeAuth map[string]httpapi.Caller

func (a fakeAuth) Check(_ context.Context, tok string) (httpapi.Caller, error) {
	c, ok := a[tok]
	if !ok {
		return httpapi.Caller{}, failure.Unauthorized("unknown credential")
	}
	return c, nil
}

type fixture struct {
	t    *testing.T
	api  *fakeAPI
	auth fakeAuth
	now  time.Time
	srv  *httptest.Server
	con  *Console
}

var roles = map[string]httpapi.Role{
	"POST /ui/nodes/{id}/{action}": httpapi.RoleOperator, "POST /ui/runs/{id}/cancel": httpapi.RoleSubmitter,
	"POST /ui/runs/{id}/resubmit": httpapi.RoleSubmitter, "GET /ui/audit": httpapi.RoleAdmin,
}

func newFixture(t *testing.T, max int) *fixture {
	f := &fixture{t: t, api: &fakeAPI{}, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	f.auth = fakeAuth{"tok-read": {Name: "ann", Role: httpapi.RoleReader}, "tok-sub": {Name: "sam", Role: httpapi.RoleSubmitter},
		"tok-inv": {Name: "ivy", Role: httpapi.RoleInvoker}}
	f.api.runs = []api.Run{{ID: "r-1", Status: api.RunRunning, RunSpec: api.RunSpec{Image: "img", Command: []string{"sleep", "9"}}}}
	f.con = New(Config{Auth: f.auth, APIFor: func(string, *http.Request) API { return f.api }, Now: func() time.Time { return f.now }, Sessions: max})
	mux := http.NewServeMux()
	declared := map[string]httpapi.Role{}
	for _, rt := range f.con.Routes() {
		declared[rt.Pattern] = cmp.Or(roles[rt.Pattern], httpapi.RoleReader)
	}
	f.con.Register(declared, mux.Handle)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

// do sends a request with cookie (may be nil), not following redirects.
func (f *fixture) do(method, path string, cookie *http.Cookie, form url.Values) *http.Response {
	f.t.Helper()
	req, _ := http.NewRequest(method, f.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if cookie != nil {
		req.AddCookie(cookie)
	}
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func body(t *testing.T, resp *http.Response) string {
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// signIn signs in with tok and returns the session cookie and the page's
// CSRF token.
func (f *fixture) signIn(tok string) (*http.Cookie, string) {
	f.t.Helper()
	resp := f.do("POST", "/ui/signin", nil, url.Values{"token": {tok}, "next": {"/ui/runs/r-1"}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/runs/r-1" {
		f.t.Fatalf("sign-in with %s: %d to %q", tok, resp.StatusCode, resp.Header.Get("Location"))
	}
	var ck *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == cookieName {
			ck = c
		}
	}
	if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/ui/" {
		f.t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/ui/", ck)
	}
	page := body(f.t, f.do("GET", "/ui/runs/r-1", ck, nil))
	_, rest, _ := strings.Cut(page, `name="csrf" value="`)
	csrf, _, _ := strings.Cut(rest, `"`)
	if csrf == "" {
		f.t.Fatalf("no CSRF token on the run page:\n%s", page)
	}
	return ck, csrf
}

func TestSignInRequiredAndRefusals(t *testing.T) {
	f := newFixture(t, 10)
	resp := f.do("GET", "/ui/fleet", nil, nil)
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/signin?next=%2Fui%2Ffleet") {
		t.Fatalf("no session: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, tok := range []string{"nope", "tok-inv", ""} {
		resp := f.do("POST", "/ui/signin", nil, url.Values{"token": {tok}})
		if resp.StatusCode/100 != 4 || len(resp.Cookies()) != 0 {
			t.Errorf("sign-in with %q: %d, cookies %v", tok, resp.StatusCode, resp.Cookies())
		}
	}
	req, _ := http.NewRequest("POST", f.srv.URL+"/ui/signin", strings.NewReader("token=tok-read"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	if resp, _ := http.DefaultClient.Do(req); resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin sign-in: %d, want 403", resp.StatusCode)
	}
}

func TestSecurityHeaders(t *testing.T) {
	f := newFixture(t, 10)
	for _, path := range []string{"/ui/signin", "/ui/fleet", "/ui/static/console.js"} {
		resp := f.do("GET", path, nil, nil)
		h := resp.Header
		if !strings.Contains(h.Get("Content-Security-Policy"), "script-src 'self'") || !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") ||
			h.Get("X-Frame-Options") != "DENY" || h.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: headers %v", path, h)
		}
	}
	page := body(t, f.do("GET", "/ui/signin", nil, nil))
	if strings.Contains(page, "<script>") || strings.Contains(page, "onclick") {
		t.Errorf("inline script on the sign-in page")
	}
}

func TestRolesAndCSRF(t *testing.T) {
	f := newFixture(t, 10)
	reader, rcsrf := f.signIn("tok-read")
	if page := body(t, f.do("GET", "/ui/runs/r-1", reader, nil)); strings.Contains(page, `id="cancel"`) {
		t.Error("a reader's run page has a cancel button")
	}
	if resp := f.do("POST", "/ui/runs/r-1/cancel", reader, url.Values{"csrf": {rcsrf}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("reader's cancel: %d, want 403", resp.StatusCode)
	}
	if resp := f.do("GET", "/ui/audit", reader, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("reader's audit page: %d, want 403", resp.StatusCode)
	}
	sub, csrf := f.signIn("tok-sub")
	if page := body(t, f.do("GET", "/ui/runs/r-1", sub, nil)); !strings.Contains(page, `id="cancel"`) {
		t.Error("a submitter's run page has no cancel button")
	}
	if resp := f.do("POST", "/ui/runs/r-1/cancel", sub, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("cancel without CSRF: %d, want 403", resp.StatusCode)
	}
	if resp := f.do("POST", "/ui/runs/r-1/cancel", sub, url.Values{"csrf": {rcsrf}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("cancel with another session's CSRF token: %d, want 403", resp.StatusCode)
	}
	if len(f.api.cancelled) != 0 {
		t.Fatalf("refused cancels reached the API: %v", f.api.cancelled)
	}
	if resp := f.do("POST", "/ui/runs/r-1/cancel", sub, url.Values{"csrf": {csrf}}); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("submitter's cancel: %d", resp.StatusCode)
	}
	if resp := f.do("POST", "/ui/nodes/n-1/cordon", sub, url.Values{"csrf": {csrf}}); resp.StatusCode != http.StatusForbidden || len(f.api.cordoned) != 0 {
		t.Errorf("submitter's cordon: %d, %v", resp.StatusCode, f.api.cordoned)
	}
	if resp := f.do("POST", "/ui/runs/r-1/resubmit", sub, url.Values{"csrf": {csrf}}); resp.Header.Get("Location") != "/ui/runs/r-new" {
		t.Errorf("resubmit: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if f.api.cancelled[0] != "r-1" || f.api.runs[1].Image != "img" {
		t.Errorf("changes: cancelled %v, runs %+v", f.api.cancelled, f.api.runs)
	}
}

func TestRevokedTokenAndSignOutEndSessions(t *testing.T) {
	f := newFixture(t, 10)
	ck, csrf := f.signIn("tok-read")
	if resp := f.do("POST", "/ui/signout", ck, url.Values{"csrf": {csrf}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", resp.StatusCode)
	}
	if resp := f.do("GET", "/ui/fleet", ck, nil); resp.StatusCode != http.StatusSeeOther || f.con.sessions.count() != 0 {
		t.Fatalf("after sign-out: %d, %d sessions", resp.StatusCode, f.con.sessions.count())
	}
	ck, _ = f.signIn("tok-read")
	delete(f.auth, "tok-read")
	resp := f.do("GET", "/ui/fleet", ck, nil)
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "why=") || f.con.sessions.count() != 0 {
		t.Fatalf("revoked token: %d to %q, %d sessions", resp.StatusCode, resp.Header.Get("Location"), f.con.sessions.count())
	}
}

func TestSessionsBoundedAndExpire(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newSessions(2, func() time.Time { return now })
	a, _ := s.create("t")
	b, _ := s.create("t")
	s.get(a) // a is now the most recently used
	c, _ := s.create("t")
	if s.get(b) != nil || s.get(a) == nil || s.get(c) == nil {
		t.Fatal("past the bound, the least recently used session should end")
	}
	now = now.Add(sessionIdle)
	if s.get(a) != nil || s.count() != 1 {
		t.Fatalf("an idle session should end: %d left", s.count())
	}
	d, _ := s.create("t") // expires c on the way
	if s.count() != 1 {
		t.Fatalf("creating should drop expired sessions: %d held", s.count())
	}
	created := now
	for i := 0; i < 100 && s.get(d) != nil; i++ {
		now = now.Add(sessionIdle / 2) // used within its idle time, again and again
	}
	if now.Sub(created) != sessionMaxAge {
		t.Fatal("a session used all along should end at its maximum age")
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{"/ui/runs/x": "/ui/runs/x", "https://evil/": "/ui/fleet", "//evil/ui/": "/ui/fleet", "/ui/\r\nX: y": "/ui/fleet", "": "/ui/fleet"} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLogStreamsLinesAsEvents(t *testing.T) {
	f := newFixture(t, 10)
	ck, _ := f.signIn("tok-read")
	resp := f.do("GET", "/ui/runs/r-1/log", ck, nil)
	got := body(t, resp)
	// The log's lines in order; the run's status, which travels beside
	// them, may come between two of them; the end last.
	one, two, three := strings.Index(got, "data: one\n\n"), strings.Index(got, "data: two\n\n"), strings.Index(got, "data: three\n\n")
	if resp.Header.Get("Content-Type") != "text/event-stream" || one < 0 || two < one || three < two ||
		!strings.Contains(got, "event: status\ndata: {\"status\":\"succeeded\",\"stage\":\"\",\"attempts\":[]}\n\n") || !strings.HasSuffix(got, "event: end\ndata: \n\n") {
		t.Fatalf("log stream %q:\n%q", resp.Header.Get("Content-Type"), got)
	}
}

func TestFleetPagesAndPicture(t *testing.T) {
	f := newFixture(t, 10)
	for i := range 250 {
		facts := api.NodeFactsDoc{"accelerators": []any{map[string]any{"uuid": "GPU-" + string(rune('a'+i%26)), "model": "H100"}}}
		n := api.Node{ID: fmt.Sprintf("n-%03d", i), Status: api.NodeReady, Facts: &facts}
		if i == 7 {
			n.Flags = []api.NodeFlag{{Kind: api.NodeFlagGPUDisputed, GPU: "GPU-h"}}
		}
		if i%26 == 2 {
			n.GPUsInUse = []string{"GPU-c"}
		}
		f.api.nodes = append(f.api.nodes, n)
	}
	ck, _ := f.signIn("tok-read")
	page := body(t, f.do("GET", "/ui/fleet?status=ready&after=n-199", ck, nil))
	if o := f.api.pages[len(f.api.pages)-1]; o != (client.NodePageOptions{Limit: fleetPage, After: "n-199", Status: "ready"}) {
		t.Fatalf("page asked with %+v", o)
	}
	if strings.Count(page, "<th scope=\"row\">") != 50 || !strings.Contains(page, "n-249") || strings.Contains(page, "Next page") {
		t.Fatalf("the last page of the fleet:\n%s", page)
	}
	if !strings.Contains(page, "busy: 10") || !strings.Contains(page, "First page") {
		t.Errorf("the page misses the fleet's counts or its way back:\n%s", page)
	}
	if first := body(t, f.do("GET", "/ui/fleet", ck, nil)); !strings.Contains(first, "after=n-099") {
		t.Errorf("the first page links no next page")
	}
	resp := f.do("GET", "/ui/fleet/gpus.png", ck, nil)
	img, err := png.Decode(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != perRow*pitch || b.Dy() != pitch || img.At(7*pitch+1, 0) != color.RGBAModel.Convert(shadeBack) || img.At(7*pitch+1, 1) != color.RGBAModel.Convert(shadeSick) {
		t.Fatalf("250 GPUs in a %v picture, want one row of %d", b, perRow)
	}
}

func TestFunctionPageAndCallLog(t *testing.T) {
	f := newFixture(t, 10)
	ck, _ := f.signIn("tok-read")
	page := body(t, f.do("GET", "/ui/functions/fn-9", ck, nil))
	for _, want := range []string{"Function resize", `href="/ui/functions/fn-9/calls/call-1"`, "<td>250ms</td><td>1s</td>", "call-2</a></th><td>queued</td><td>—</td>"} {
		if !strings.Contains(page, want) {
			t.Errorf("function page lacks %q:\n%s", want, page)
		}
	}
	log := body(t, f.do("GET", "/ui/functions/fn-9/calls/call-1", ck, nil))
	if !strings.Contains(log, "resized &lt;b&gt;3&lt;/b&gt; images") {
		t.Errorf("the call's log, escaped:\n%s", log)
	}
}

func TestEventWriterHoldsPartialLines(t *testing.T) {
	var out bytes.Buffer
	e := &eventWriter{w: &out}
	e.Write([]byte("par"))
	if out.Len() != 0 {
		t.Fatal("a partial line was sent")
	}
	e.Write([]byte("tial\nnext"))
	e.close()
	if out.String() != "data: partial\n\ndata: next\n\n" {
		t.Fatalf("%q", out.String())
	}
}

// TestQueueTabInSchedulingOrder: the Queue tab lists the runs in the order
// the scheduler considers them, each with its place, where the replica
// knows it; elsewhere it falls back to the queued runs newest first and
// says so.
func TestQueueTabInSchedulingOrder(t *testing.T) {
	f := newFixture(t, 10)
	f.api.runs = append(f.api.runs, api.Run{ID: "r-new", Status: api.RunQueued, Reason: "waiting"}, api.Run{ID: "r-old", Status: api.RunQueued, Reason: "waiting"})
	ck, _ := f.signIn("tok-read")
	page := body(t, f.do("GET", "/ui/runs?tab=queue", ck, nil))
	if !strings.Contains(page, "newest first") || !strings.Contains(page, "r-new") {
		t.Errorf("off the scheduling replica the queue tab lacks the newest-first listing:\n%s", page)
	}
	f.api.queue = []string{"r-old", "r-new"}
	page = body(t, f.do("GET", "/ui/runs?tab=queue", ck, nil))
	old, neu := strings.Index(page, "r-old"), strings.Index(page, "r-new")
	if !strings.Contains(page, "order the scheduler considers them") || old < 0 || neu < old ||
		!strings.Contains(page, "1 of 2 in default") || !strings.Contains(page, "2 of 2 in default") {
		t.Errorf("the queue tab is not in scheduling order with positions:\n%s", page)
	}
}
