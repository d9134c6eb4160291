package livesession

import (
	"net/http/httptest"
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
	if cmd := <-ls.Commands; cmd.FencingToken != 2 || cmd.Kind != nodeproto.KindInvoke {
		t.Errorf("sent %+v, want an invoke under fencing token 2", cmd)
	}
	for range cap(ls.Commands) {
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
