package callstream

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mercator/mercator/nodeproto"
)

// TestServeDeliversEachFrame: the head comes back before any frame is
// sent, each frame is delivered with a body of its own, and a malformed
// frame ends the stream without delivering what follows it.
func TestServeDeliversEachFrame(t *testing.T) {
	got := make(chan nodeproto.CallAnswer, 8)
	ended := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(ended)
		Serve(w, r, slog.New(slog.NewTextHandler(io.Discard, nil)), "n1", func(a nodeproto.CallAnswer) { got <- a }, nil)
	}))
	defer srv.Close()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, srv.URL, pr)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req) // returns with the head, the body still open
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("head: %v %v", resp, err)
	}
	defer resp.Body.Close()
	first := nodeproto.AppendCallAnswer(nil, nodeproto.CallAnswer{Rendezvous: "rv-1", Status: 200, Body: []byte("one")})
	second := nodeproto.AppendCallAnswer(nil, nodeproto.CallAnswer{Rendezvous: "rv-2", Status: 200, Body: []byte("two")})
	if _, err := pw.Write(append(first, second...)); err != nil {
		t.Fatal(err)
	}
	a, b := <-got, <-got
	if a.Rendezvous != "rv-1" || string(a.Body) != "one" || b.Rendezvous != "rv-2" || string(b.Body) != "two" {
		t.Fatalf("delivered %+v and %+v", a, b)
	}
	// A frame whose length is cut off by the type of a malformed one.
	after := nodeproto.AppendCallAnswer(nil, nodeproto.CallAnswer{Rendezvous: "rv-3", ErrorKind: "busy"})
	pw.Write(append([]byte{3, 9, 0, 0}, after...))
	<-ended
	pw.Close()
	select {
	case a := <-got:
		t.Fatalf("delivered %+v after a malformed frame", a)
	default:
	}
	if !bytes.Equal(a.Body, []byte("one")) {
		t.Fatal("a delivered body changed when the stream's buffer was reused")
	}
}
