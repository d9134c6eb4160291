package nodeagent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/mercator/mercator/nodeproto"
)

// FuzzSessionStream serves arbitrary bytes as the control plane's answer
// to a session stream (a status and a body of command lines: what a
// broken proxy, or a server that is not Mercator's, could send). The
// agent's transport must return, with an error or at the stream's end,
// never panic, and pass on only decoded commands that are not keep-alives;
// every command it passes must be one the agent can key and version.
func FuzzSessionStream(f *testing.F) {
	f.Add(200, []byte(`{"kind":"keep_alive"}`+"\n"+`{"kind":"launch_workload","operation_id":"op","fencing_token":1,"launch_workload":{"run_id":"r","attempt":1}}`+"\n"))
	f.Add(200, []byte(`{"kind":"stop_workload","stop_workload":{"run_id":"r","attempt":1}}`+"\n\n  \n"))
	f.Add(200, []byte("{not json\n"))
	f.Add(401, []byte(`{"error":{"code":"unauthorized","message":"session expired"}}`))
	f.Add(409, []byte(`{"error":{"code":"fenced","message":"enrolled again"}}`))
	f.Add(502, []byte(`<html>bad gateway</html>`))
	f.Add(200, []byte(`{"kind":"invoke","invoke":{}}`+"\n"+`{"kind":"prepare_artifact","prepare_artifact":{"name":"a"}}`))
	// A binary invoke frame (nodeproto/invokebin.go) between JSON lines.
	f.Add(200, append(nodeproto.AppendInvokeFrame([]byte(`{"kind":"keep_alive"}`+"\n"), 1,
		&nodeproto.InvokeCommand{CallID: "c", Rendezvous: "rv", URL: "u", Body: []byte("a\nb")}), `{"kind":"keep_alive"}`+"\n"...))
	var answer atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := answer.Load().([2]any)
		w.WriteHeader(a[0].(int))
		w.Write(a[1].([]byte))
	}))
	f.Cleanup(srv.Close)
	tr := NewHTTPTransport(srv.URL, nil)
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		if status < 200 || status > 599 {
			status = 200
		}
		if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
			// The agent waits what these ask before it answers (at least
			// 100 ms, several times; transport_test covers that): an input
			// must take microseconds for fuzzing to explore, so they stand
			// for another refusal here.
			status = http.StatusBadGateway
		}
		answer.Store([2]any{status, body})
		commands := make(chan nodeproto.Command, len(body)+1)
		err := tr.Session(context.Background(), "n1", "tok", commands)
		close(commands)
		if status != http.StatusOK && err == nil {
			t.Fatalf("a %d answer ended the session without an error", status)
		}
		if err != nil && err.Error() == "" {
			t.Fatal("an empty error")
		}
		for cmd := range commands {
			if cmd.Kind == nodeproto.KindKeepAlive {
				t.Fatal("a keep-alive was passed on as a command")
			}
			_ = commandKey(cmd)
			_ = nodeproto.RequiredVersion(cmd)
		}
	})
}
