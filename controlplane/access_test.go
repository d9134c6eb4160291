package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/access"
	"github.com/mercator/mercator/controlplane/function"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// callAs sends an API request with tok ("" for none) and returns the
// status and body.
func callAs(t *testing.T, f *fnFixture, tok, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, f.http.URL+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	return resp.StatusCode, data
}

// decodeJSON decodes data into v, failing the test when it is not JSON of
// that shape.
func decodeJSON(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("decoding %s: %v", data, err)
	}
}

// mintToken creates a named token through the API, as the admin.
func mintToken(t *testing.T, f *fnFixture, req api.TokenRequest) string {
	t.Helper()
	var out api.TokenCreated
	f.want(201, &out, "POST", "/v1/tokens", req)
	if out.Secret == "" || out.Name != req.Name || out.Role != req.Role {
		t.Fatalf("token create = %+v", out)
	}
	return out.Secret
}

var rank = map[string]int{"reader": 1, "submitter": 2, "operator": 3, "admin": 4}

// TestRoleMatrixFromServedOpenAPI calls every route of the served OpenAPI
// document with every role, and without a credential, and checks that
// each is refused (403) exactly when the route's x-mercator-role and
// x-mercator-invoker say so. Allowed means any status but 403: dummy IDs
// and empty bodies are answered 400 or 404.
func TestRoleMatrixFromServedOpenAPI(t *testing.T) {
	f := newFnFixture(t)
	status, data := callAs(t, f, "", "GET", "/v1/openapi.json", nil)
	if status != 200 {
		t.Fatalf("openapi.json = %d", status)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	for _, role := range []string{"reader", "submitter", "operator", "admin"} {
		tokens[role] = mintToken(t, f, api.TokenRequest{Name: "matrix-" + role, Role: role})
	}
	tokens["invoker"] = mintToken(t, f, api.TokenRequest{Name: "matrix-invoker", Role: "invoker", App: "matrix"})
	param := regexp.MustCompile(`\{[a-z_]+(\.\.\.)?\}`)
	var paths []string
	for p := range doc.Paths {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	routes := 0
	for _, path := range paths {
		for method, raw := range doc.Paths[path] {
			if method == "parameters" {
				continue
			}
			var op struct {
				Role    string `json:"x-mercator-role"`
				Invoker bool   `json:"x-mercator-invoker"`
				Public  bool   `json:"x-mercator-public"`
			}
			decodeJSON(t, raw, &op)
			if rank[op.Role] == 0 {
				t.Errorf("%s %s: x-mercator-role %q is not a role", method, path, op.Role)
				continue
			}
			routes++
			url := param.ReplaceAllString(path, "matrix-none")
			m := strings.ToUpper(method)
			body := any(nil)
			if m == "POST" || m == "PUT" || m == "PATCH" {
				body = "{}"
			}
			for role, tok := range tokens {
				allowed := rank[role] >= rank[op.Role] || (role == "invoker" && op.Invoker)
				got, data := callAs(t, f, tok, m, url, body)
				if (got == http.StatusForbidden) == allowed {
					t.Errorf("%s %s as %s = %d %s; declared %s (invoker %v)", m, path, role, got, data, op.Role, op.Invoker)
				}
				if got == http.StatusForbidden && !allowed {
					// The /v1 error shape, or Fn's ({"message": …}) on
					// the Fn-compatible routes.
					var e api.Error
					var fe api.FnError
					decodeJSON(t, data, &e)
					decodeJSON(t, data, &fe)
					want := role + " may not " + m + " " + path + "; it needs " + op.Role
					if strings.HasPrefix(path, "/v1/") && (e.Error.Code != "forbidden" || e.Error.Message != want) ||
						!strings.HasPrefix(path, "/v1/") && fe.Message != want {
						t.Errorf("%s %s as %s: refusal %s, want the message %q (code forbidden on /v1)", m, path, role, data, want)
					}
				}
			}
			if got, data := callAs(t, f, "", m, url, body); (!op.Public && got != http.StatusUnauthorized) || got < 300 {
				t.Errorf("%s %s without a credential = %d %s", m, path, got, data)
			}
		}
	}
	if routes < 50 {
		t.Errorf("the served document has %d operations; the walk missed some", routes)
	}
	// /metrics needs a reader's credential.
	if got, _ := callAs(t, f, "", "GET", "/metrics", nil); got != http.StatusUnauthorized {
		t.Errorf("/metrics without a credential = %d", got)
	}
	if got, _ := callAs(t, f, tokens["reader"], "GET", "/metrics", nil); got != http.StatusOK {
		t.Errorf("/metrics as reader = %d", got)
	}
	if got, _ := callAs(t, f, tokens["invoker"], "GET", "/metrics", nil); got != http.StatusForbidden {
		t.Errorf("/metrics as invoker = %d", got)
	}
}

// TestInvokerConfinedToItsApp: an invoker key calls its app's functions
// and triggers, and nothing else; a trigger is callable without a
// credential only when it is public.
func TestInvokerConfinedToItsApp(t *testing.T) {
	f := newFnFixture(t)
	f.startNode("n1", echo)
	app, fn := f.deploy("mine", api.Fn{Name: "echo"})
	other, otherFn := f.deploy("theirs", api.Fn{Name: "echo"})
	f.want(200, nil, "POST", "/v2/triggers", api.Trigger{Name: "t", AppID: app.ID, FnID: fn.ID, Type: "http", Source: "/private"})
	f.want(200, nil, "POST", "/v2/triggers", api.Trigger{Name: "p", AppID: app.ID, FnID: fn.ID, Type: "http", Source: "/open",
		Annotations: api.Annotations{function.PublicAnnotation: json.RawMessage("true")}})
	f.want(200, nil, "POST", "/v2/triggers", api.Trigger{Name: "t", AppID: other.ID, FnID: otherFn.ID, Type: "http", Source: "/private"})
	key := mintToken(t, f, api.TokenRequest{Name: "bot", Role: "invoker", App: "mine"})
	for _, c := range []struct {
		tok, method, path string
		want              int
	}{
		{key, "POST", "/invoke/" + fn.ID, 201},
		{key, "POST", "/invoke/" + fn.ID + "/async", 202},
		{key, "POST", "/t/mine/private", 201},
		{key, "POST", "/invoke/" + otherFn.ID, 403},
		{key, "POST", "/invoke/" + otherFn.ID + "/async", 403},
		{key, "POST", "/t/theirs/private", 403},
		{key, "GET", "/v2/apps", 403},
		{key, "GET", "/v1/runs", 403},
		{"", "POST", "/t/mine/private", 401},
		{"", "POST", "/t/theirs/private", 401},
		{"", "POST", "/t/mine/open", 201},
		{"", "POST", "/invoke/" + fn.ID, 401},
	} {
		if got, data := callAs(t, f, c.tok, c.method, c.path, "ping"); got != c.want {
			t.Errorf("%s %s (credential %v) = %d %s, want %d", c.method, c.path, c.tok != "", got, data, c.want)
		}
	}
}

// TestTokenLifecycle: token ls never shows a secret, token rm is refused
// at the very next call, names are unique, and the last admin stays.
func TestTokenLifecycle(t *testing.T) {
	f := newFnFixture(t)
	exp := int64(3600)
	ci := mintToken(t, f, api.TokenRequest{Name: "ci", Role: "reader", ExpiresSeconds: exp})
	if got, _ := callAs(t, f, ci, "GET", "/v1/runs", nil); got != 200 {
		t.Fatalf("reader GET /v1/runs = %d", got)
	}
	f.want(409, nil, "POST", "/v1/tokens", api.TokenRequest{Name: "ci", Role: "admin"})
	f.want(400, nil, "POST", "/v1/tokens", api.TokenRequest{Name: "x", Role: "root"})
	f.want(400, nil, "POST", "/v1/tokens", api.TokenRequest{Name: "x", Role: "invoker"})
	f.want(400, nil, "POST", "/v1/tokens", api.TokenRequest{Name: "x", Role: "reader", App: "a"})
	var list api.TokenList
	_, _, raw := f.do("GET", "/v1/tokens", nil)
	decodeJSON(t, raw, &list)
	if len(list.Tokens) != 2 || list.Tokens[0].Name != "admin" || list.Tokens[0].Role != "admin" || list.Tokens[1].Name != "ci" || list.Tokens[1].ExpiresAt == nil {
		t.Errorf("token ls = %s", raw)
	}
	if bytes.Contains(raw, []byte(ci)) || bytes.Contains(raw, []byte(f.token)) || bytes.Contains(raw, []byte("hash")) {
		t.Errorf("token ls shows a secret or a hash: %s", raw)
	}
	f.want(204, nil, "DELETE", "/v1/tokens/ci", nil)
	if got, _ := callAs(t, f, ci, "GET", "/v1/runs", nil); got != http.StatusUnauthorized {
		t.Errorf("a removed token = %d, want 401 at once", got)
	}
	f.want(404, nil, "DELETE", "/v1/tokens/ci", nil)
	// The bootstrap admin credential is a named token like the others:
	// removable once another admin exists, never the last one.
	f.want(409, nil, "DELETE", "/v1/tokens/admin", nil)
	second := mintToken(t, f, api.TokenRequest{Name: "ops-admin", Role: "admin"})
	f.want(204, nil, "DELETE", "/v1/tokens/admin", nil)
	if got, _ := callAs(t, f, f.token, "GET", "/v1/runs", nil); got != http.StatusUnauthorized {
		t.Errorf("the removed bootstrap credential = %d", got)
	}
	if got, _ := callAs(t, f, second, "DELETE", "/v1/tokens/ops-admin", nil); got != http.StatusConflict {
		t.Errorf("removing the last admin = %d, want 409", got)
	}
}

// TestTokenExpires: a token past its expiry is refused.
func TestTokenExpires(t *testing.T) {
	f := newFnFixture(t)
	tok := mintToken(t, f, api.TokenRequest{Name: "brief", Role: "reader", ExpiresSeconds: 60})
	if got, _ := callAs(t, f, tok, "GET", "/v1/runs", nil); got != 200 {
		t.Fatalf("fresh token = %d", got)
	}
	f.skew.Store(int64(2 * time.Minute))
	if got, _ := callAs(t, f, tok, "GET", "/v1/runs", nil); got != http.StatusUnauthorized {
		t.Errorf("expired token = %d, want 401", got)
	}
}

// enrollNode invites a node through the API and enrolls it.
func enrollNode(t *testing.T, f *fnFixture, id string) nodeproto.Enrollment {
	t.Helper()
	var inv api.Invitation
	f.want(201, &inv, "POST", "/v1/nodes/"+id+"/invitations", nil)
	e, err := f.tr.Enroll(context.Background(), nodeproto.EnrollmentRequest{NodeID: id, Invitation: inv.Token, CapabilityVersion: nodeproto.Version})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestNodeRemoveFencesItsAgent: node rm ends the session stream, refuses
// every later call with a fencing error naming the command (on which the
// agent stops), revokes unused invitations, and shows the node
// unreachable; a new invitation brings it back.
func TestNodeRemoveFencesItsAgent(t *testing.T) {
	f := newFnFixture(t)
	n := f.startNode("n1", echo)
	var spare api.Invitation
	f.want(201, &spare, "POST", "/v1/nodes/n1/invitations", nil)
	var node api.Node
	n.endExpected.Store(true)
	f.want(200, &node, "DELETE", "/v1/nodes/n1", nil)
	if node.RemovedAt == nil || node.Status != api.NodeUnreachable {
		t.Errorf("removed node = %+v", node)
	}
	select {
	case <-n.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the node's session stream outlived node rm")
	}
	ctx := context.Background()
	_, err := f.tr.SendEvents(ctx, "n1", n.tok, nil)
	if !errors.Is(err, failure.ErrFenced) || !strings.Contains(err.Error(), "mercator node rm n1") {
		t.Errorf("a call after node rm = %v, want a fencing refusal naming `mercator node rm n1`", err)
	}
	if err := f.tr.Session(ctx, "n1", n.tok, make(chan nodeproto.Command)); !errors.Is(err, failure.ErrFenced) {
		t.Errorf("a session after node rm = %v, want fenced", err)
	}
	if _, err := f.tr.RenewSession(ctx, "n1", n.tok); !errors.Is(err, failure.ErrFenced) {
		t.Errorf("a renewal after node rm = %v, want fenced", err)
	}
	if _, err := f.tr.Enroll(ctx, nodeproto.EnrollmentRequest{NodeID: "n1", Invitation: spare.Token}); !errors.Is(err, failure.ErrUnauthorized) {
		t.Errorf("an unused invitation after node rm = %v, want refused", err)
	}
	e := enrollNode(t, f, "n1") // brought back
	if _, err := f.tr.SendEvents(ctx, "n1", e.SessionToken, nil); err != nil {
		t.Errorf("a node brought back: %v", err)
	}
}

// TestInviteRevokesOlderUnusedInvitations: a new invitation voids the
// node's unused ones, and node invitations lists them without tokens.
func TestInviteRevokesOlderUnusedInvitations(t *testing.T) {
	f := newFnFixture(t)
	var old, fresh api.Invitation
	f.want(201, &old, "POST", "/v1/nodes/n2/invitations", nil)
	f.want(201, &fresh, "POST", "/v1/nodes/n2/invitations", nil)
	var list api.InvitationList
	_, _, raw := f.do("GET", "/v1/nodes/n2/invitations", nil)
	decodeJSON(t, raw, &list)
	if len(list.Invitations) != 1 || list.Invitations[0].Status != "unused" || bytes.Contains(raw, []byte(fresh.Token)) {
		t.Errorf("invitations = %s", raw)
	}
	ctx := context.Background()
	if _, err := f.tr.Enroll(ctx, nodeproto.EnrollmentRequest{NodeID: "n2", Invitation: old.Token}); !errors.Is(err, failure.ErrUnauthorized) {
		t.Errorf("the older invitation enrolled: %v", err)
	}
	if _, err := f.tr.Enroll(ctx, nodeproto.EnrollmentRequest{NodeID: "n2", Invitation: fresh.Token}); err != nil {
		t.Errorf("the newest invitation: %v", err)
	}
	_, _, raw = f.do("GET", "/v1/nodes/n2/invitations", nil)
	if decodeJSON(t, raw, &list); len(list.Invitations) != 1 || list.Invitations[0].Status != "spent" {
		t.Errorf("invitations after enrollment = %s", raw)
	}
}

// TestRenewalRetiresTheCredentialItReplaces: after renewals from one
// session, only the caller's credential (for access.RenewOverlap) and the newest
// are valid.
func TestRenewalRetiresTheCredentialItReplaces(t *testing.T) {
	f := newFnFixture(t)
	e := enrollNode(t, f, "n3")
	ctx := context.Background()
	var renewed []string
	for range 5 {
		r, err := f.tr.RenewSession(ctx, "n3", e.SessionToken)
		if err != nil {
			t.Fatal(err)
		}
		renewed = append(renewed, r.SessionToken)
	}
	for i, tok := range renewed[:4] {
		if _, err := f.tr.SendEvents(ctx, "n3", tok, nil); !errors.Is(err, failure.ErrUnauthorized) {
			t.Errorf("renewal %d's credential after a later renewal: %v, want refused", i, err)
		}
	}
	newest := renewed[4]
	if _, err := f.tr.SendEvents(ctx, "n3", newest, nil); err != nil {
		t.Errorf("the newest credential: %v", err)
	}
	if _, err := f.tr.SendEvents(ctx, "n3", e.SessionToken, nil); err != nil {
		t.Errorf("the renewing credential within the overlap: %v", err)
	}
	f.skew.Store(int64(access.RenewOverlap + time.Second))
	if _, err := f.tr.SendEvents(ctx, "n3", e.SessionToken, nil); !errors.Is(err, failure.ErrUnauthorized) {
		t.Errorf("the renewing credential after the overlap: %v, want refused", err)
	}
	var n int
	f.st.View(ctx, func(tx store.Tx) error {
		for _, tok := range append(renewed, e.SessionToken) {
			if _, err := tx.GetSession(hashOf(tok)); err == nil {
				n++
			}
		}
		return nil
	})
	if n != 2 {
		t.Errorf("%d session credentials stored after 5 renewals, want 2", n)
	}
}

func hashOf(tok string) string { return HashToken(tok) }

// TestAuditLog: mutations and refusals are recorded with who, from where,
// what and the outcome, never a secret; reads and invocations are not.
func TestAuditLog(t *testing.T) {
	f := newFnFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.srv.audit.Run(ctx) }()
	f.startNode("n1", echo)
	_, fn := f.deploy("app", api.Fn{Name: "echo"})
	reader := mintToken(t, f, api.TokenRequest{Name: "ci", Role: "reader"})
	f.want(201, nil, "POST", "/invoke/"+fn.ID, "ping")
	f.want(200, nil, "POST", "/v1/nodes/n1/cordon", nil)
	callAs(t, f, reader, "POST", "/v1/nodes/n1/drain", "{}")
	callAs(t, f, "mca_wrong", "GET", "/v1/runs", nil)
	f.want(200, nil, "GET", "/v1/nodes", nil)
	cancel()
	<-done
	var list api.AuditList
	_, _, raw := f.do("GET", "/v1/audit", nil)
	decodeJSON(t, raw, &list)
	seen := map[string]api.AuditEntry{}
	for _, e := range list.Entries {
		seen[e.Route+" "+e.Who] = e
		if e.Remote == "" || e.At.IsZero() {
			t.Errorf("entry without where or when: %+v", e)
		}
	}
	for _, want := range []struct {
		key    string
		status int
	}{
		{"POST /v1/tokens admin", 201},
		{"POST /v1/nodes/{id}/cordon admin", 200},
		{"POST /v1/nodes/{id}/drain ci", 403},
		{"GET /v1/runs ", 401},
		{"POST " + nodeproto.PathEnroll + " node:n1", 200},
	} {
		if e, ok := seen[want.key]; !ok || e.Status != want.status {
			t.Errorf("audit lacks %q with status %d: %s", want.key, want.status, raw)
		}
	}
	if e := seen["POST /v1/nodes/{id}/cordon admin"]; e.Object != "n1" {
		t.Errorf("cordon entry's object = %q", e.Object)
	}
	for k := range seen {
		if strings.HasPrefix(k, "GET /v1/nodes ") || strings.HasPrefix(k, "POST /invoke/") {
			t.Errorf("audit recorded %q (a read or an invocation)", k)
		}
	}
	if bytes.Contains(raw, []byte(reader)) || bytes.Contains(raw, []byte(f.token)) || bytes.Contains(raw, []byte("mca_wrong")) {
		t.Errorf("the audit log holds a secret: %s", raw)
	}
	_, _, raw = f.do("GET", "/v1/audit?who=ci", nil)
	if decodeJSON(t, raw, &list); len(list.Entries) != 1 {
		t.Errorf("audit ?who=ci = %s", raw)
	}
}

// idleRuntime is a node with nothing on it: enough for an agent that only
// holds its session.
type idleRuntime struct{}

func (idleRuntime) Facts(context.Context) (nodeproto.NodeFacts, error) {
	return nodeproto.NodeFacts{CapabilityVersion: nodeproto.Version, CPUs: 1, MemoryBytes: 1 << 30}, nil
}
func (idleRuntime) PrepareImage(context.Context, nodeproto.PrepareImageCommand) error { return nil }
func (idleRuntime) PrepareArtifact(context.Context, nodeproto.PrepareArtifactCommand) error {
	return nil
}
func (idleRuntime) LaunchWorkload(context.Context, nodeproto.LaunchWorkloadCommand) error { return nil }
func (idleRuntime) StopWorkload(context.Context, nodeproto.StopWorkloadCommand) error     { return nil }
func (idleRuntime) Observe(context.Context) ([]nodeproto.WorkloadObservation, error)      { return nil, nil }

// TestAgentStopsOnNodeRemove: a real agent, enrolled with its invitation
// alone, stops (rather than retrying) once `node rm` removes its node, with
// an error naming the command.
func TestAgentStopsOnNodeRemove(t *testing.T) {
	f := newFnFixture(t)
	var inv api.Invitation
	f.want(201, &inv, "POST", "/v1/nodes/n9/invitations", nil)
	state, err := nodeagent.OpenState(t.TempDir(), nodeagent.WithoutFsync())
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	agent := nodeagent.New(nodeagent.Identity{ControlPlaneURL: f.http.URL, NodeID: "n9", EnrollmentToken: inv.Token}, idleRuntime{},
		f.tr, state, nodeagent.WithHeartbeat(50*time.Millisecond), nodeagent.WithReconnectBackoff(20*time.Millisecond),
		nodeagent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	stopped := make(chan error, 1)
	go func() { stopped <- agent.Run(context.Background()) }()
	deadline := time.Now().Add(5 * time.Second)
	for f.srv.streams.Get("n9") == nil {
		if time.Now().After(deadline) {
			t.Fatal("the agent's session did not open")
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.want(200, nil, "DELETE", "/v1/nodes/n9", nil)
	select {
	case err := <-stopped:
		if !errors.Is(err, failure.ErrFenced) || !strings.Contains(err.Error(), "mercator node rm n9") {
			t.Errorf("the agent stopped with %v, want a fencing refusal naming `mercator node rm n9`", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the agent of a removed node is still running")
	}
}
