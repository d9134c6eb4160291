package nodeagent

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/mercator/mercator/nodeproto"
)

// TestCallLogCommandAnswered: a call_log command is answered over the
// agent's own request to the asking replica, authenticated as the node,
// and is not an operation (no result event). An agent without functions
// keeps no logs and says so; a command fenced below the node's token is
// answered as keeping none, with that reason. (An agent with functions
// answering with a log is the end-to-end tests'.)
func TestCallLogCommandAnswered(t *testing.T) {
	type answer struct{ path, node, auth, unknown string }
	var mu sync.Mutex
	var answers []answer
	cp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		answers = append(answers, answer{r.Method + " " + r.URL.Path, r.Header.Get(nodeproto.HeaderNodeID), r.Header.Get("Authorization"), r.Header.Get(nodeproto.HeaderCallLogUnknown)})
		mu.Unlock()
	}))
	defer cp.Close()
	got := func() []answer {
		mu.Lock()
		defer mu.Unlock()
		return append([]answer(nil), answers...)
	}

	rt, tr := newMemRuntime(), &chanTransport{commands: make(chan nodeproto.Command)}
	defer startTestAgent(t, rt, tr, t.TempDir())()
	ask := func(fence uint64, request string) {
		tr.commands <- nodeproto.Command{Kind: nodeproto.KindCallLog, FencingToken: fence,
			CallLog: &nodeproto.CallLogCommand{CallID: "call-1", Request: request, URL: cp.URL}}
	}
	ask(5, "lq-current")
	waitUntil(t, "an answer", func() bool { return len(got()) == 1 })
	ask(4, "lq-fenced") // the node holds token 5
	waitUntil(t, "a second answer", func() bool { return len(got()) == 2 })

	a := got()
	if a[0].path != "POST "+nodeproto.PathCallLogs+"lq-current" || a[0].node != "n1" || !strings.HasPrefix(a[0].auth, "Bearer ") ||
		a[0].unknown != "this agent runs no functions" {
		t.Errorf("answer = %+v", a[0])
	}
	if a[1].path != "POST "+nodeproto.PathCallLogs+"lq-fenced" || !strings.Contains(a[1].unknown, "fenced at token 4") {
		t.Errorf("answer to a fenced command = %+v", a[1])
	}
	if r := tr.results(""); len(r) != 0 {
		t.Errorf("a call_log command was recorded as an operation: %+v", r)
	}
}
