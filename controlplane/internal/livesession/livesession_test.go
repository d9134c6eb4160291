package livesession

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mercator/mercator/nodeproto"
)

// TestSend: a command reaches the latest session of its node under that
// session's fencing token; a node without a session here is not held, a
// full session is held but not sent to, and a session's end closes lost.
func TestSend(t *testing.T) {
	var l Registry
	if _, held, _ := l.Send("n1", nodeproto.Command{Kind: nodeproto.KindInvoke}); held {
		t.Fatal("a node without a session was held")
	}
	old := l.Attach("n1", 1, httptest.NewRequest("POST", "/", nil))
	ls := l.Attach("n1", 2, httptest.NewRequest("POST", "/", nil))
	l.Detach(old) // an older stream ending leaves the newer one registered
	lost, held, sent := l.Send("n1", nodeproto.Command{Kind: nodeproto.KindInvoke})
	if !held || !sent {
		t.Fatalf("send to a held session: held %v sent %v", held, sent)
	}
	select {
	case <-ls.Ready():
	default:
		t.Fatal("a command was queued and the stream was not told")
	}
	if cmds := ls.take(); len(cmds) != 1 || cmds[0].FencingToken != 2 || cmds[0].Kind != nodeproto.KindInvoke {
		t.Errorf("sent %+v, want an invoke under fencing token 2", cmds)
	}
	for range MaxQueued {
		l.Send("n1", nodeproto.Command{Kind: nodeproto.KindCallLog})
	}
	if _, held, sent := l.Send("n1", nodeproto.Command{Kind: nodeproto.KindCallLog}); !held || sent {
		t.Errorf("send to a full session: held %v sent %v, want held and not sent", held, sent)
	}
	l.Detach(ls)
	select {
	case <-lost:
	default:
		t.Error("lost did not close when the session ended")
	}
	if l.Get("n1") != nil {
		t.Error("a detached session is still registered")
	}
}

// TestInvokesTakeTheAttachedRoute: an invoke for a node whose session is
// held here goes by the route attached for it when that route was opened
// under the session's fencing token and takes it, with that token; by the
// session otherwise (no route, another enrollment's, one that refuses, or
// one detached). Other commands always go by the session, and nothing
// goes anywhere for a node whose session is not held here.
func TestInvokesTakeTheAttachedRoute(t *testing.T) {
	var reg Registry
	invoke := func(rv string) nodeproto.Command {
		return nodeproto.Command{Kind: nodeproto.KindInvoke, Invoke: &nodeproto.InvokeCommand{Rendezvous: rv}}
	}
	var routed []string
	var tokens []uint64
	open := true
	send := func(fencing uint64, cmd *nodeproto.InvokeCommand) bool {
		if !open {
			return false
		}
		routed, tokens = append(routed, cmd.Rendezvous), append(tokens, fencing)
		return true
	}
	detach := reg.AttachInvokes("n1", 5, send)
	if _, held, _ := reg.Send("n1", invoke("rv-0")); held || len(routed) != 0 {
		t.Fatal("an invoke went somewhere for a node whose session is not held here")
	}
	ls := reg.Attach("n1", 5, httptest.NewRequest("POST", "/", strings.NewReader("")))
	sessionGot := func() string {
		cmds := ls.take()
		switch {
		case len(cmds) == 0:
			return ""
		case len(cmds) > 1:
			t.Fatalf("%d commands queued, want one", len(cmds))
		case cmds[0].Invoke == nil:
			return string(cmds[0].Kind)
		}
		return cmds[0].Invoke.Rendezvous
	}
	lost, held, sent := reg.Send("n1", invoke("rv-1"))
	if !held || !sent || lost == nil || len(routed) != 1 || routed[0] != "rv-1" || tokens[0] != 5 || sessionGot() != "" {
		t.Fatalf("routed %v tokens %v: the invoke did not take the route", routed, tokens)
	}
	reg.Send("n1", nodeproto.Command{Kind: nodeproto.KindCallLog, CallLog: &nodeproto.CallLogCommand{}})
	if len(routed) != 1 || sessionGot() != string(nodeproto.KindCallLog) {
		t.Fatal("a call_log question did not go by the session")
	}
	open = false
	reg.Send("n1", invoke("rv-2"))
	if len(routed) != 1 || sessionGot() != "rv-2" {
		t.Fatal("an invoke the route refused did not go by the session")
	}
	open = true
	detach()
	reg.Send("n1", invoke("rv-3"))
	if len(routed) != 1 || sessionGot() != "rv-3" {
		t.Fatal("an invoke took a detached route")
	}
	reg.AttachInvokes("n1", 4, send) // a superseded enrollment's stream
	reg.Send("n1", invoke("rv-4"))
	if len(routed) != 1 || sessionGot() != "rv-4" {
		t.Fatal("an invoke took a route opened under another fencing token")
	}
	later := reg.AttachInvokes("n1", 5, send)
	detach() // the first attachment's detach leaves the later one be
	reg.Send("n1", invoke("rv-5"))
	if len(routed) != 2 || routed[1] != "rv-5" {
		t.Fatal("an earlier attachment's detach removed a later one")
	}
	later()
}

// flushes counts Flush calls.
type flushes int

func (f *flushes) Flush() { *f++ }

// TestForwardSendsWhatIsQueuedInOrder: Forward writes every queued command
// in the order sent, under the session's fencing token, and flushes once;
// with nothing queued it writes nothing; the queue holds no more than
// MaxQueued, and empties as it is sent so more can be queued.
func TestForwardSendsWhatIsQueuedInOrder(t *testing.T) {
	var l Registry
	ls := l.Attach("n1", 7, httptest.NewRequest("POST", "/", nil))
	for i := range MaxQueued + 1 {
		_, _, sent := l.Send("n1", nodeproto.Command{Kind: nodeproto.KindCallLog, OperationID: fmt.Sprint(i)})
		if sent != (i < MaxQueued) {
			t.Fatalf("command %d: sent %v", i, sent)
		}
	}
	var buf bytes.Buffer
	var f flushes
	if err := ls.Forward(&buf, json.NewEncoder(&buf), &f); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(&buf)
	for i := range MaxQueued {
		var cmd nodeproto.Command
		if err := dec.Decode(&cmd); err != nil || cmd.OperationID != fmt.Sprint(i) || cmd.FencingToken != 7 {
			t.Fatalf("command %d on the stream: %+v, %v", i, cmd, err)
		}
	}
	if dec.More() || f != 1 {
		t.Errorf("more on the stream, or %d flushes, want 1", f)
	}
	if _, _, sent := l.Send("n1", nodeproto.Command{Kind: nodeproto.KindCallLog}); !sent {
		t.Error("the queue did not empty as it was sent")
	}
	buf.Reset()
	ls.take()
	if err := ls.Forward(&buf, json.NewEncoder(&buf), &f); err != nil || buf.Len() != 0 {
		t.Errorf("forward with nothing queued wrote %q, %v", buf.String(), err)
	}
}
