package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
)

// t0 is the fake's clock and the CLI's "now" in tests.
var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// fakeAPI stands in for the control plane's public routes. Runs and nodes
// are set by the test; every request is recorded.
type fakeAPI struct {
	mu       sync.Mutex
	runs     map[string]api.Run
	order    []string
	nodes    map[string]api.Node
	logs     map[string]string
	submits  []api.RunSpec
	requests []*http.Request
	invites  []api.InvitationRequest
	srv      *httptest.Server
	// batches counts POST /v1/runs/batch calls; failBatch, when positive,
	// is the first call (1-based) answered 503, creating nothing, as is
	// every call after it.
	batches   int
	failBatch int
	// keyed is the run each idempotency key created (POST /v1/runs); with
	// loseFirst, the first keyed submission's answer is lost after its run
	// was created (the connection closed, as by a replica that died).
	keyed     map[string]api.Run
	loseFirst bool
	// onCreate, when set, changes each run as it is created (a test of
	// run submit --wait makes it terminal, so the wait ends).
	onCreate func(api.Run) api.Run
}

const testToken = "tok-admin"

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{runs: map[string]api.Run{}, nodes: map[string]api.Node{}, logs: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/runs", f.submit)
	mux.HandleFunc("POST /v1/runs/batch", f.submitBatch)
	mux.HandleFunc("GET /v1/runs", f.list)
	mux.HandleFunc("GET /v1/runs/{id}", f.get)
	mux.HandleFunc("POST /v1/runs/{id}/cancel", f.cancel)
	mux.HandleFunc("GET /v1/runs/{id}/wait", f.wait)
	mux.HandleFunc("GET /v1/runs/{id}/logs", f.logsOf)
	mux.HandleFunc("GET /v1/nodes", f.nodeList)
	mux.HandleFunc("GET /v1/nodes/{id}", f.nodeGet)
	mux.HandleFunc("POST /v1/nodes/{id}/invitations", f.invite)
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r.Clone(context.Background()))
		f.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+testToken {
			writeErr(w, 401, api.ErrorBody{Code: "unauthorized", Message: "wrong token"})
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, b api.ErrorBody) {
	writeJSON(w, status, api.Error{Error: b})
}

func (f *fakeAPI) addRun(r api.Run) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.runs[r.ID]; !ok {
		f.order = append(f.order, r.ID)
	}
	f.runs[r.ID] = r
}

func (f *fakeAPI) submit(w http.ResponseWriter, r *http.Request) {
	var spec api.RunSpec
	if err := json.NewDecoder(r.Body).Decode(&spec); err != nil {
		writeErr(w, 400, api.ErrorBody{Code: "invalid", Message: err.Error()})
		return
	}
	if spec.Image == "bad" {
		writeErr(w, 400, api.ErrorBody{Code: "invalid", Field: "image", Message: `cannot resolve "bad" to a digest`})
		return
	}
	key := r.Header.Get(api.HeaderIdempotencyKey)
	f.mu.Lock()
	earlier, replay := f.keyed[key]
	f.mu.Unlock()
	if key != "" && replay {
		w.Header().Set(api.HeaderIdempotentReplayed, "true")
		writeJSON(w, http.StatusCreated, earlier)
		return
	}
	run := f.create(spec)
	f.mu.Lock()
	if f.keyed == nil {
		f.keyed = map[string]api.Run{}
	}
	f.keyed[key] = run
	lose := f.loseFirst
	f.loseFirst = false
	f.mu.Unlock()
	if lose {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	writeJSON(w, http.StatusCreated, run)
}

// create stores a queued run of spec with the next ID: r-1, r-2, …
func (f *fakeAPI) create(spec api.RunSpec) api.Run {
	f.mu.Lock()
	f.submits = append(f.submits, spec)
	id := "r-" + strconv.Itoa(len(f.submits))
	f.mu.Unlock()
	run := api.Run{ID: id, RunSpec: spec, PinnedImage: spec.Image + "@sha256:abc", Status: api.RunQueued,
		Attempts: []api.Attempt{}, CreatedAt: t0, UpdatedAt: t0}
	if f.onCreate != nil {
		run = f.onCreate(run)
	}
	f.addRun(run)
	return run
}

// submitBatch is POST /v1/runs/batch: all or none, as the control plane's.
func (f *fakeAPI) submitBatch(w http.ResponseWriter, r *http.Request) {
	var req api.RunBatch
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeErr(w, 400, api.ErrorBody{Code: "invalid", Message: err.Error()})
		return
	}
	f.mu.Lock()
	f.batches++
	fail := f.failBatch > 0 && f.batches >= f.failBatch
	f.mu.Unlock()
	if fail {
		writeErr(w, 503, api.ErrorBody{Code: "unavailable", Message: "the database is unreachable"})
		return
	}
	if len(req.Runs) == 0 || len(req.Runs) > api.MaxRunBatch {
		writeErr(w, 400, api.ErrorBody{Code: "invalid", Field: "runs", Message: "wrong size"})
		return
	}
	for i, spec := range req.Runs {
		if spec.Image == "bad" {
			writeErr(w, 400, api.ErrorBody{Code: "invalid", Field: "runs[" + strconv.Itoa(i) + "].image", Message: `cannot resolve "bad" to a digest`})
			return
		}
	}
	out := api.RunList{Runs: []api.Run{}}
	for _, spec := range req.Runs {
		out.Runs = append(out.Runs, f.create(spec))
	}
	writeJSON(w, http.StatusCreated, out)
}

func (f *fakeAPI) run(w http.ResponseWriter, r *http.Request) (api.Run, bool) {
	f.mu.Lock()
	run, ok := f.runs[r.PathValue("id")]
	f.mu.Unlock()
	if !ok {
		writeErr(w, 404, api.ErrorBody{Code: "not_found", Message: `run "` + r.PathValue("id") + `" not found`})
	}
	return run, ok
}

func (f *fakeAPI) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := api.RunList{Runs: []api.Run{}}
	for i := len(f.order) - 1; i >= 0; i-- {
		list.Runs = append(list.Runs, f.runs[f.order[i]])
	}
	writeJSON(w, 200, list)
}

func (f *fakeAPI) get(w http.ResponseWriter, r *http.Request) {
	if run, ok := f.run(w, r); ok {
		writeJSON(w, 200, run)
	}
}

func (f *fakeAPI) cancel(w http.ResponseWriter, r *http.Request) {
	if run, ok := f.run(w, r); ok {
		run.Cancel = true
		f.addRun(run)
		writeJSON(w, 200, run)
	}
}

func (f *fakeAPI) wait(w http.ResponseWriter, r *http.Request) {
	if run, ok := f.run(w, r); ok {
		writeJSON(w, 200, run)
	}
}

func (f *fakeAPI) logsOf(w http.ResponseWriter, r *http.Request) {
	if _, ok := f.run(w, r); ok {
		w.Header().Set("Content-Type", "text/plain")
		f.mu.Lock()
		out := f.logs[r.PathValue("id")]
		f.mu.Unlock()
		_, _ = io.WriteString(w, out)
	}
}

func (f *fakeAPI) nodeList(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := api.NodeList{Nodes: []api.Node{}}
	for _, id := range command.SortedKeys(f.nodes) {
		list.Nodes = append(list.Nodes, f.nodes[id])
	}
	writeJSON(w, 200, list)
}

func (f *fakeAPI) nodeGet(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	n, ok := f.nodes[r.PathValue("id")]
	f.mu.Unlock()
	if !ok {
		writeErr(w, 404, api.ErrorBody{Code: "not_found", Message: "node not found"})
		return
	}
	writeJSON(w, 200, n)
}

func (f *fakeAPI) invite(w http.ResponseWriter, r *http.Request) {
	var req api.InvitationRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	f.invites = append(f.invites, req)
	f.mu.Unlock()
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if ttl == 0 {
		ttl = 24 * time.Hour
	}
	id := r.PathValue("id")
	writeJSON(w, 201, api.Invitation{NodeID: id, Token: "inv-secret", ExpiresAt: t0.Add(ttl),
		Command: "mercator agent --server " + f.srv.URL + " --node-id " + id + " --invitation inv-secret"})
}

func (f *fakeAPI) lastRequest() *http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		return nil
	}
	return f.requests[len(f.requests)-1]
}

func (f *fakeAPI) requestCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

// result is what one CLI execution produced.
type result struct {
	stdout, stderr string
	code           int
}

// cli runs the command line against the fake, with MERCATOR_ADDR and
// MERCATOR_TOKEN pointing at it and HOME at an empty directory.
func (f *fakeAPI) cli(t *testing.T, args ...string) result {
	t.Helper()
	env := map[string]string{"MERCATOR_ADDR": f.srv.URL, "MERCATOR_TOKEN": testToken, "HOME": t.TempDir()}
	return runCLI(t, env, args...)
}

func runCLI(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	inv := &command.Invocation{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
		Env: func(k string) string { return env[k] }, Now: func() time.Time { return t0 }}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := execute(ctx, inv, args)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}
