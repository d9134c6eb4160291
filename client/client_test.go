package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
)

// recorded is one request a test server saw.
type recorded struct {
	Method string
	Path   string
	Query  map[string][]string
	Auth   string
	CType  string
	Body   []byte
}

// fakeAPI is an httptest server whose routes are set per test; it records
// every request.
type fakeAPI struct {
	t   *testing.T
	srv *httptest.Server
	mu  sync.Mutex
	got []recorded
}

func newFake(t *testing.T, h http.HandlerFunc) (*fakeAPI, *Client) {
	t.Helper()
	f := &fakeAPI{t: t}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.got = append(f.got, recorded{
			Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(),
			Auth: r.Header.Get("Authorization"), CType: r.Header.Get("Content-Type"), Body: body,
		})
		f.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(f.srv.Close)
	c := New(f.srv.URL+"/", "tok-1", nil)
	c.sleep = func(ctx context.Context, d time.Duration) error { return ctx.Err() }
	return f, c
}

func (f *fakeAPI) requests() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.got...)
}

func (f *fakeAPI) only() recorded {
	f.t.Helper()
	got := f.requests()
	if len(got) != 1 {
		f.t.Fatalf("got %d requests, want 1: %+v", len(got), got)
	}
	return got[0]
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func intp(i int) *int { return &i }

func TestSubmitRunRequestShape(t *testing.T) {
	want := api.Run{ID: "r-1", PinnedImage: "alpine@sha256:abc", Status: api.RunQueued, Attempts: []api.Attempt{}}
	f, c := newFake(t, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusCreated, want) })
	spec := api.RunSpec{Image: "alpine:3", Command: []string{"echo", "hi"}, Env: map[string]string{"A": "1"},
		CPU: 0.5, MemoryBytes: 64 << 20, TimeoutSeconds: 60, Retries: 2}
	run, err := c.SubmitRun(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if run.ID != "r-1" || run.PinnedImage != want.PinnedImage {
		t.Errorf("run = %+v", run)
	}
	req := f.only()
	if req.Method != http.MethodPost || req.Path != "/v1/runs" {
		t.Errorf("request %s %s, want POST /v1/runs", req.Method, req.Path)
	}
	if req.Auth != "Bearer tok-1" {
		t.Errorf("Authorization = %q", req.Auth)
	}
	if req.CType != "application/json" {
		t.Errorf("Content-Type = %q", req.CType)
	}
	var sent api.RunSpec
	if err := json.Unmarshal(req.Body, &sent); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(sent, spec) {
		t.Errorf("sent %+v, want %+v", sent, spec)
	}
}

func TestRequestShapes(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		call   func(c *Client) error
		method string
		path   string
		query  map[string][]string
		body   string
		resp   any
	}{
		{"GetRun", func(c *Client) error { _, err := c.GetRun(ctx, "r-1"); return err },
			"GET", "/v1/runs/r-1", map[string][]string{}, "", api.Run{ID: "r-1"}},
		{"ListRuns", func(c *Client) error {
			l, err := c.ListRuns(ctx, ListRunsOptions{Statuses: []string{"queued", "running"}, Limit: 5, Before: "r-9"})
			if err == nil && l.Runs == nil {
				err = errors.New("nil runs")
			}
			return err
		}, "GET", "/v1/runs", map[string][]string{"status": {"queued,running"}, "limit": {"5"}, "before": {"r-9"}}, "", map[string]any{"runs": nil}},
		{"ListRunsZero", func(c *Client) error { _, err := c.ListRuns(ctx, ListRunsOptions{}); return err },
			"GET", "/v1/runs", map[string][]string{}, "", api.RunList{}},
		{"CancelRun", func(c *Client) error { _, err := c.CancelRun(ctx, "r-1"); return err },
			"POST", "/v1/runs/r-1/cancel", map[string][]string{}, "", api.Run{ID: "r-1"}},
		{"ListNodes", func(c *Client) error {
			l, err := c.ListNodes(ctx)
			if err == nil && l.Nodes == nil {
				err = errors.New("nil nodes")
			}
			return err
		}, "GET", "/v1/nodes", map[string][]string{}, "", api.NodeList{}},
		{"GetNode", func(c *Client) error { _, err := c.GetNode(ctx, "n 1"); return err },
			"GET", "/v1/nodes/n 1", map[string][]string{}, "", api.Node{ID: "n 1"}},
		{"InviteNode", func(c *Client) error {
			inv, err := c.InviteNode(ctx, "n-1", 89500*time.Millisecond)
			if err == nil && inv.Token != "secret" {
				err = errors.New("token not decoded")
			}
			return err
		}, "POST", "/v1/nodes/n-1/invitations", map[string][]string{}, `{"ttl_seconds":90}`, api.Invitation{NodeID: "n-1", Token: "secret"}},
		{"InviteNodeDefaultTTL", func(c *Client) error { _, err := c.InviteNode(ctx, "n-1", 0); return err },
			"POST", "/v1/nodes/n-1/invitations", map[string][]string{}, `{}`, api.Invitation{NodeID: "n-1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, c := newFake(t, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, tc.resp) })
			if err := tc.call(c); err != nil {
				t.Fatal(err)
			}
			req := f.only()
			if req.Method != tc.method || req.Path != tc.path {
				t.Errorf("request %s %s, want %s %s", req.Method, req.Path, tc.method, tc.path)
			}
			if req.Auth != "Bearer tok-1" {
				t.Errorf("Authorization = %q", req.Auth)
			}
			if !reflect.DeepEqual(req.Query, tc.query) {
				t.Errorf("query = %v, want %v", req.Query, tc.query)
			}
			if strings.TrimSpace(string(req.Body)) != tc.body {
				t.Errorf("body = %q, want %q", req.Body, tc.body)
			}
		})
	}
}

func TestErrorTranslation(t *testing.T) {
	cases := []struct {
		name      string
		status    int
		body      string
		kind      error
		field     string
		inMessage string
	}{
		{"invalid with field", 400, `{"error":{"code":"invalid","message":"image must name a repository","field":"image"}}`,
			failure.ErrInvalid, "image", "image must name a repository"},
		{"code beats status", 500, `{"error":{"code":"conflict","message":"run already ended"}}`,
			failure.ErrConflict, "", "run already ended"},
		{"not found without body", 404, ``, failure.ErrNotFound, "", "Not Found"},
		{"unauthorized", 401, `{"error":{"code":"unauthorized","message":"bad token"}}`,
			failure.ErrUnauthorized, "", "bad token"},
		{"proxy page", 502, `<html>bad gateway</html>`, failure.ErrUnavailable, "", "<html>bad gateway</html>"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, c := newFake(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			})
			_, err := c.SubmitRun(context.Background(), api.RunSpec{})
			if !errors.Is(err, tc.kind) {
				t.Fatalf("err = %v, want kind %v", err, tc.kind)
			}
			var fe *failure.Error
			if !errors.As(err, &fe) {
				t.Fatalf("err %v is not a *failure.Error", err)
			}
			if fe.Field != tc.field {
				t.Errorf("field = %q, want %q", fe.Field, tc.field)
			}
			if !strings.Contains(err.Error(), tc.inMessage) {
				t.Errorf("message %q lacks %q", err.Error(), tc.inMessage)
			}
		})
	}
}

func TestUnreachableIsUnavailable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close()
	_, err := New(addr, "t", nil).GetRun(context.Background(), "r-1")
	if !errors.Is(err, failure.ErrUnavailable) {
		t.Fatalf("err = %v, want unavailable", err)
	}
}

func TestBareHostPort(t *testing.T) {
	if got := New("127.0.0.1:7070/", "t", nil).Addr(); got != "http://127.0.0.1:7070" {
		t.Errorf("Addr = %q", got)
	}
}

func TestWaitRunLoopsUntilTerminal(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	f, c := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		switch n {
		case 1:
			writeJSON(w, 200, api.Run{ID: "r-1", Status: api.RunQueued})
		case 2:
			writeJSON(w, 503, api.Error{Error: api.ErrorBody{Code: "unavailable", Message: "restarting"}})
		case 3:
			writeJSON(w, 200, api.Run{ID: "r-1", Status: api.RunRunning})
		default:
			writeJSON(w, 200, api.Run{ID: "r-1", Status: api.RunSucceeded, ExitCode: intp(0)})
		}
	})
	var slept []time.Duration
	c.sleep = func(ctx context.Context, d time.Duration) error { slept = append(slept, d); return nil }
	var seen []string
	run, err := c.WaitRunFunc(context.Background(), "r-1", func(r api.Run) { seen = append(seen, r.Status) })
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != api.RunSucceeded {
		t.Errorf("status = %q", run.Status)
	}
	if want := []string{"queued", "running", "succeeded"}; !reflect.DeepEqual(seen, want) {
		t.Errorf("observed %v, want %v", seen, want)
	}
	reqs := f.requests()
	if len(reqs) != 4 {
		t.Fatalf("%d requests, want 4", len(reqs))
	}
	for _, r := range reqs {
		if r.Method != "GET" || r.Path != "/v1/runs/r-1/wait" || r.Query["timeout"][0] != "30s" {
			t.Errorf("request %s %s %v", r.Method, r.Path, r.Query)
		}
	}
	if len(slept) == 0 {
		t.Error("no pause before retrying the 503 or after instant polls")
	}
}

func TestWaitRunStopsOnPermanentError(t *testing.T) {
	f, c := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 404, api.Error{Error: api.ErrorBody{Code: "not_found", Message: `run "r-x" not found`}})
	})
	_, err := c.WaitRun(context.Background(), "r-x")
	if !errors.Is(err, failure.ErrNotFound) {
		t.Fatalf("err = %v", err)
	}
	if n := len(f.requests()); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

func TestWaitRunGivesUpAfterRetries(t *testing.T) {
	f, c := newFake(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) })
	c.retries = 3
	_, err := c.WaitRun(context.Background(), "r-1")
	if !errors.Is(err, failure.ErrUnavailable) {
		t.Fatalf("err = %v", err)
	}
	if n := len(f.requests()); n != 4 {
		t.Errorf("%d requests, want 4 (1 + 3 retries)", n)
	}
}

func TestWaitRunContextEnds(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	_, c := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.WaitRun(ctx, "r-1")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
}

// chunkWriter hands every Write to a channel so a test sees what arrived
// and when.
type chunkWriter chan string

func (w chunkWriter) Write(p []byte) (int, error) { w <- string(p); return len(p), nil }

func TestLogsStreamsAsBytesArrive(t *testing.T) {
	second := make(chan struct{})
	f, c := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "hello\n")
		w.(http.Flusher).Flush()
		<-second // the client must have written the first chunk by now
		_, _ = io.WriteString(w, "world\n")
	})
	out := make(chunkWriter, 10)
	done := make(chan error, 1)
	go func() { done <- c.Logs(context.Background(), "r-1", true, out) }()
	select {
	case got := <-out:
		if got != "hello\n" {
			t.Fatalf("first chunk %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("first chunk not written before the stream ended")
	}
	close(second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(out)
	var rest strings.Builder
	for s := range out {
		rest.WriteString(s)
	}
	if rest.String() != "world\n" {
		t.Errorf("rest = %q", rest.String())
	}
	req := f.only()
	if req.Path != "/v1/runs/r-1/logs" || req.Query["follow"][0] != "true" || req.Query["offset"] != nil {
		t.Errorf("request %s %v", req.Path, req.Query)
	}
}

func TestLogsResumesAtOffset(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	f, c := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Content-Length", "100")
			_, _ = io.WriteString(w, "abc")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // cut the connection mid-body
		}
		_, _ = io.WriteString(w, "def")
	})
	var out strings.Builder
	if err := c.Logs(context.Background(), "r-1", false, &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != "abcdef" {
		t.Errorf("out = %q", out.String())
	}
	reqs := f.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	if reqs[0].Query["follow"][0] != "false" || reqs[1].Query["offset"][0] != "3" {
		t.Errorf("queries %v, %v", reqs[0].Query, reqs[1].Query)
	}
}

func TestLogsError(t *testing.T) {
	_, c := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 404, api.Error{Error: api.ErrorBody{Code: "not_found", Message: "no such run"}})
	})
	err := c.Logs(context.Background(), "r-x", true, io.Discard)
	if !errors.Is(err, failure.ErrNotFound) {
		t.Fatalf("err = %v", err)
	}
}

type failWriter struct{}

func (failWriter) Write(p []byte) (int, error) { return 0, errors.New("broken pipe") }

func TestLogsWriteErrorNotRetried(t *testing.T) {
	f, c := newFake(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "x") })
	err := c.Logs(context.Background(), "r-1", true, failWriter{})
	if err == nil || !strings.Contains(err.Error(), "broken pipe") {
		t.Fatalf("err = %v", err)
	}
	if n := len(f.requests()); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

func TestSubmitRunsRequestShape(t *testing.T) {
	specs := []api.RunSpec{{Image: "alpine:3", Command: []string{"echo", "0"}}, {Image: "alpine:3", Command: []string{"echo", "1"}, CPU: 0.5}}
	f, c := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusCreated, api.RunList{Runs: []api.Run{{ID: "r-a", RunSpec: specs[0]}, {ID: "r-b", RunSpec: specs[1]}}})
	})
	runs, err := c.SubmitRuns(context.Background(), specs)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].ID != "r-a" || runs[1].ID != "r-b" {
		t.Errorf("runs = %+v", runs)
	}
	req := f.only()
	if req.Method != http.MethodPost || req.Path != "/v1/runs/batch" || req.Auth != "Bearer tok-1" || req.CType != "application/json" {
		t.Errorf("request %s %s (auth %q, type %q), want POST /v1/runs/batch", req.Method, req.Path, req.Auth, req.CType)
	}
	var sent api.RunBatch
	if err := json.Unmarshal(req.Body, &sent); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(sent.Runs, specs) {
		t.Errorf("sent %+v, want %+v", sent.Runs, specs)
	}
}

func TestSubmitRunsErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("refused spec names its index", func(t *testing.T) {
		_, c := newFake(t, func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusBadRequest, api.Error{Error: api.ErrorBody{Code: "invalid", Field: "runs[1].image", Message: "is required"}})
		})
		runs, err := c.SubmitRuns(ctx, make([]api.RunSpec, 2))
		var fe *failure.Error
		if runs != nil || !errors.Is(err, failure.ErrInvalid) || !errors.As(err, &fe) || fe.Field != "runs[1].image" {
			t.Errorf("runs %v, err %v; want none and an invalid error naming runs[1].image", runs, err)
		}
	})
	for name, n := range map[string]int{"empty": 0, "over the limit": api.MaxRunBatch + 1} {
		t.Run(name, func(t *testing.T) {
			f, c := newFake(t, func(w http.ResponseWriter, r *http.Request) { t.Error("a request was sent") })
			_, err := c.SubmitRuns(ctx, make([]api.RunSpec, n))
			var fe *failure.Error
			if !errors.As(err, &fe) || !errors.Is(err, failure.ErrInvalid) || fe.Field != "runs" {
				t.Errorf("err = %v, want invalid naming runs", err)
			}
			if len(f.requests()) != 0 {
				t.Errorf("%d requests sent", len(f.requests()))
			}
		})
	}
	t.Run("answer without one run per spec", func(t *testing.T) {
		_, c := newFake(t, func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusCreated, api.RunList{Runs: []api.Run{{ID: "r-a"}}})
		})
		runs, err := c.SubmitRuns(ctx, make([]api.RunSpec, 2))
		if err == nil || len(runs) != 1 || runs[0].ID != "r-a" {
			t.Errorf("runs %v, err %v; want the one run listed and an error", runs, err)
		}
	})
}
