package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// fuzzServer is a control plane over a memstore, called in process (no
// listener: a fuzzer makes thousands of calls a second), with an admin
// token and one enrolled node.
type fuzzServer struct {
	h       http.Handler
	st      store.Store
	admin   string
	node    string
	session string
}

func newFuzzServer(tb testing.TB) *fuzzServer {
	tb.Helper()
	st := memstore.New()
	srv := New(Config{Lease: time.Minute, SessionTTL: time.Hour, RegistryKey: bytes.Repeat([]byte{7}, RegistryKeySize)}, st, pinResolver{}, nil)
	fs := &fuzzServer{h: srv.Handler(), st: st, admin: "mca_" + httpapi.RandomToken(), node: "n1"}
	now := time.Now()
	inv := "mci_" + httpapi.RandomToken()
	if err := st.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.CreateToken(store.Token{Hash: httpapi.HashToken(fs.admin), Name: "admin", CreatedAt: now}); err != nil {
			return err
		}
		if err := tx.PutNode(store.Node{ID: fs.node, CreatedAt: now}); err != nil {
			return err
		}
		return tx.CreateInvitation(store.Invitation{TokenHash: httpapi.HashToken(inv), NodeID: fs.node, CreatedAt: now, ExpiresAt: now.Add(time.Hour)})
	}); err != nil {
		tb.Fatal(err)
	}
	var e nodeproto.Enrollment
	body, _ := json.Marshal(nodeproto.EnrollmentRequest{NodeID: fs.node, Invitation: inv, CapabilityVersion: nodeproto.Version})
	if status, raw := fs.call(http.MethodPost, nodeproto.PathEnroll, "", body); status != http.StatusOK || json.Unmarshal(raw, &e) != nil {
		tb.Fatalf("enroll: %d %s", status, raw)
	}
	fs.session = e.SessionToken
	return fs
}

// call serves one request; token "" sends none.
func (fs *fuzzServer) call(method, path, token string, body []byte) (int, []byte) {
	req := httptest.NewRequest(method, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if path == nodeproto.PathEvents || path == nodeproto.PathEnroll {
		req.Header.Set(nodeproto.HeaderNodeID, fs.node)
	}
	w := httptest.NewRecorder()
	fs.h.ServeHTTP(w, req)
	return w.Code, w.Body.Bytes()
}

// apiAnswer checks an answer of the /v1 API: never a 500 (a malformed
// request must not reach a panic or an unexplained failure), and every
// refusal in the API's error shape with a code and a message.
func apiAnswer(t *testing.T, what string, status int, raw []byte) {
	t.Helper()
	if status >= 500 {
		t.Fatalf("%s answered %d: %s", what, status, raw)
	}
	if status >= 400 {
		var e api.Error
		if err := json.Unmarshal(raw, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
			t.Fatalf("%s answered %d %s, not the API's error shape", what, status, raw)
		}
	}
}

// FuzzSubmitRun posts arbitrary bodies to POST /v1/runs. A body the API
// accepts is a run whose stored spec is valid and readable back; anything
// else is a 4xx naming what was wrong.
func FuzzSubmitRun(f *testing.F) {
	for _, s := range []string{
		`{"image":"127.0.0.1:5000/hello:1","command":["/work"],"cpu":1,"memory_bytes":1073741824}`,
		`{"image":"127.0.0.1:5000/hello:1","gpus":2,"gpu_model":"H100","env":{"A":"b"},"max_attempts":3,"timeout_seconds":60}`,
		`{"image":"127.0.0.1:5000/hello:1","artifacts":[{"name":"data","mount_path":"/d"}]}`,
		`{"image":"","cpu":-1}`, `{"image":"x","memory_bytes":1e30}`, `{"env":{"":"x"}}`, `[]`, `null`, `{"image":"x"}{}`, `{"unknown":1}`,
	} {
		f.Add([]byte(s))
	}
	fs := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, raw := fs.call(http.MethodPost, "/v1/runs", fs.admin, body)
		apiAnswer(t, "POST /v1/runs", status, raw)
		if status/100 != 2 {
			return
		}
		var run api.Run
		if err := json.Unmarshal(raw, &run); err != nil || run.ID == "" {
			t.Fatalf("accepted answer %s is not a run: %v", raw, err)
		}
		if err := run.RunSpec.Validate(); err != nil {
			t.Fatalf("accepted run %s holds an invalid spec: %v", run.ID, err)
		}
		if status, raw := fs.call(http.MethodGet, "/v1/runs/"+run.ID, fs.admin, nil); status != http.StatusOK {
			t.Fatalf("accepted run %s reads back %d %s", run.ID, status, raw)
		}
	})
}

// FuzzNodeEvents posts arbitrary bodies to the node protocol's events
// route as an enrolled node (facts, workload observations and results are
// all in it: what a misbehaving or compromised node could send). None
// may fail the server, and the node's session must still work after.
func FuzzNodeEvents(f *testing.F) {
	for _, s := range []string{
		`{"events":[]}`,
		`{"events":[{"id":"e1","kind":"facts","at":"2026-12-01T00:00:00Z","facts":{"cpus":16,"memory_bytes":68719476736}}]}`,
		`{"events":[{"id":"e2","kind":"workload","at":"2026-12-01T00:00:00Z","workload":{"workload_id":"w","state":"running"}}]}`,
		`{"events":[{"id":"e3","kind":"result","at":"2026-12-01T00:00:00Z","result":{"command_id":"c","ok":true}}]}`,
		`{"events":[{"id":"","kind":"facts"}]}`, `{"events":[{"id":"e4","kind":"facts","facts":{"cpus":-1,"gpus":[{"uuid":"GPU-dup"},{"uuid":"GPU-dup"}]}}]}`,
		`{"events":[{"id":"e5","kind":"nope"}]}`, `{"events":null}`, `{}`, `[`,
	} {
		f.Add([]byte(s))
	}
	fs := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, raw := fs.call(http.MethodPost, nodeproto.PathEvents, fs.session, body)
		apiAnswer(t, "POST "+nodeproto.PathEvents, status, raw)
		if status, raw := fs.call(http.MethodPost, nodeproto.PathEvents, fs.session, []byte(`{"events":[]}`)); status != http.StatusOK {
			t.Fatalf("after %q the node's heartbeat answered %d %s", body, status, raw)
		}
		if status, raw := fs.call(http.MethodGet, "/v1/nodes/"+fs.node, fs.admin, nil); status != http.StatusOK {
			t.Fatalf("after %q the node reads %d %s", body, status, raw)
		}
	})
}

// FuzzFnAPI posts arbitrary bodies to the Fn-compatible API's create
// routes. Whatever arrives, the answer is never a 5xx, and a refusal is
// in Fn's error shape ({"message": …}).
func FuzzFnAPI(f *testing.F) {
	for _, s := range []string{
		`{"name":"a"}`, `{"name":"a","config":{"K":"v"},"annotations":{"x":"y"}}`, `{"name":"a b"}`, `{"name":""}`,
		`{"app_id":"x","name":"f","image":"127.0.0.1:5000/hello:1","memory":128,"timeout":30}`, `{"name":"a","syslog_url":"tcp://x"}`, `{`, `null`,
	} {
		f.Add("/v2/apps", []byte(s))
		f.Add("/v2/fns", []byte(s))
	}
	fs := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		if path != "/v2/apps" && path != "/v2/fns" {
			path = "/v2/apps"
		}
		status, raw := fs.call(http.MethodPost, path, fs.admin, body)
		if status >= 500 {
			t.Fatalf("POST %s answered %d: %s", path, status, raw)
		}
		if status >= 400 {
			var e struct {
				Message string `json:"message"`
			}
			if err := json.Unmarshal(raw, &e); err != nil || e.Message == "" {
				t.Fatalf("POST %s answered %d %s, not Fn's error shape", path, status, raw)
			}
		}
	})
}
