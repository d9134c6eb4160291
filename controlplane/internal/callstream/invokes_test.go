package callstream

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// agentEnd is the agent's side of one call answers stream that asks for
// invokes, and what the test watches of the replica's.
type agentEnd struct {
	iv      *Invokes      // what the handler attached
	invokes io.Reader     // where the invoke frames arrive
	end     func()        // the agent ends the stream cleanly
	cut     func()        // the connection cut under it
	close   func()        // the agent closes its end (TLS's own clean close, no end frame)
	ended   chan struct{} // closed when Serve returned
}

// modes are the stream's two ways: on a request's body and its answer,
// and on the connection itself (nodeproto.CallAnswersUpgrade).
var modes = []struct {
	name   string
	onConn bool
}{{"on a body", false}, {"on the connection", true}}

// invokesStream serves one call answers stream that asks for invokes, over
// TLS and HTTP/1.1 as agents speak it, on the connection when onConn.
func invokesStream(t *testing.T, onConn bool) agentEnd {
	t.Helper()
	attached := make(chan *Invokes, 1)
	e := agentEnd{ended: make(chan struct{})}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(e.ended)
		Serve(w, r, slog.New(slog.NewTextHandler(io.Discard, nil)), "n1", func(nodeproto.CallAnswer) {},
			func(iv *Invokes) func() { attached <- iv; return func() {} })
	}))
	t.Cleanup(srv.Close)
	// The raw connection, to cut it as a network would (no TLS alert).
	var raw net.Conn
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		raw = c
		return c, err
	}
	t.Cleanup(tr.CloseIdleConnections)
	var body io.Reader = http.NoBody
	pr, pw := io.Pipe()
	if !onConn {
		body = pr
	}
	req, err := http.NewRequest(http.MethodPost, srv.URL+nodeproto.PathCallAnswers, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(nodeproto.HeaderCallInvokes, nodeproto.CallInvokesBinary)
	want := http.StatusOK
	if onConn {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", nodeproto.CallAnswersUpgrade)
		want = http.StatusSwitchingProtocols
	}
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != want {
		t.Fatalf("head: %v %v", resp, err)
	}
	if resp.Header.Get(nodeproto.HeaderCallInvokes) != nodeproto.CallInvokesBinary {
		t.Fatal("the answer's head does not say invokes may come")
	}
	t.Cleanup(func() { resp.Body.Close() })
	e.iv, e.invokes, e.cut, e.close = <-attached, resp.Body, func() { raw.Close() }, func() { resp.Body.Close() }
	e.end = func() { pw.Close() }
	if onConn {
		e.end = func() {
			conn := resp.Body.(io.ReadWriteCloser)
			if _, err := conn.Write(nodeproto.AppendCallAnswersEnd(nil)); err != nil {
				t.Error(err)
			}
			if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
				t.Error(err)
			}
		}
	}
	return e
}

// readInvokeFrames reads n invoke frames from r.
func readInvokeFrames(t *testing.T, r *bufio.Reader, n int) []nodeproto.Command {
	t.Helper()
	var out []nodeproto.Command
	for len(out) < n {
		head, err := r.Peek(2)
		if err != nil {
			t.Fatalf("after %d frames: %v", len(out), err)
		}
		size, err := nodeproto.InvokeFrameLen(head)
		for err == nil && size == 0 {
			head, err = r.Peek(len(head) + 1)
			if err == nil {
				size, err = nodeproto.InvokeFrameLen(head)
			}
		}
		if err != nil {
			t.Fatalf("frame %d: %v", len(out), err)
		}
		frame := make([]byte, size)
		if _, err := io.ReadFull(r, frame); err != nil {
			t.Fatal(err)
		}
		cmd, err := nodeproto.DecodeInvokeFrame(frame)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, cmd)
	}
	return out
}

// TestInvokesReachTheAgentOnce: frames sent from many goroutines at once
// arrive whole, each once, with their fencing token; the agent's end of
// the stream closes it cleanly (Broken stays open) and later sends are
// refused, for the caller to use the session.
func TestInvokesReachTheAgentOnce(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { invokesReachTheAgentOnce(t, m.onConn) })
	}
}

func invokesReachTheAgentOnce(t *testing.T, onConn bool) {
	e := invokesStream(t, onConn)
	iv := e.iv
	const senders, each = 8, 50
	var wg sync.WaitGroup
	for g := 0; g < senders; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				cmd := &nodeproto.InvokeCommand{CallID: "c", Rendezvous: fmt.Sprintf("rv-%d-%d", g, i), URL: "https://cp", AnswerStream: true,
					Body: []byte("body"), BodyInline: true, ContentLength: 4}
				if !iv.Send(7, cmd) {
					t.Error("an open stream refused an invoke")
				}
			}
		}()
	}
	seen := map[string]int{}
	br := bufio.NewReader(e.invokes)
	for _, cmd := range readInvokeFrames(t, br, senders*each) {
		if cmd.FencingToken != 7 || string(cmd.Invoke.Body) != "body" || !cmd.Invoke.AnswerStream {
			t.Fatalf("frame %+v %+v", cmd, cmd.Invoke)
		}
		seen[cmd.Invoke.Rendezvous]++
	}
	wg.Wait()
	for rv, n := range seen {
		if n != 1 {
			t.Fatalf("%s arrived %d times", rv, n)
		}
	}
	if len(seen) != senders*each {
		t.Fatalf("%d distinct invokes arrived, want %d", len(seen), senders*each)
	}
	e.end() // the agent ends the stream, and reads to the replica's end
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Fatalf("%d bytes after the last frame", len(rest))
	}
	e.close()
	<-e.ended
	select {
	case <-iv.Broken():
		t.Fatal("a stream the agent ended is said to be broken")
	default:
	}
	if iv.Send(7, &nodeproto.InvokeCommand{Rendezvous: "rv-late"}) {
		t.Fatal("an ended stream took an invoke")
	}
}

// TestInvokesBrokenWhenTheConnectionIsCut: a stream whose connection goes
// away before the agent ended it says so (the callers waiting on it send
// again by the session) and takes no more.
func TestInvokesBrokenWhenTheConnectionIsCut(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			e := invokesStream(t, m.onConn)
			if !e.iv.Send(1, &nodeproto.InvokeCommand{Rendezvous: "rv-1"}) {
				t.Fatal("an open stream refused an invoke")
			}
			e.cut()
			<-e.iv.Broken()
			<-e.ended
			if e.iv.Send(1, &nodeproto.InvokeCommand{Rendezvous: "rv-2"}) {
				t.Fatal("a broken stream took an invoke")
			}
		})
	}
	// On the connection only the end frame ends the stream cleanly: a
	// connection closed without it (even with TLS's own close) is a cut.
	t.Run("closed without the end frame", func(t *testing.T) {
		e := invokesStream(t, true)
		if !e.iv.Send(1, &nodeproto.InvokeCommand{Rendezvous: "rv-1"}) {
			t.Fatal("an open stream refused an invoke")
		}
		e.close()
		<-e.iv.Broken()
		<-e.ended
	})
}

// TestNoInvokesUnlessAsked: a stream that does not ask, or a handler
// with nowhere to attach them, answers without the header and attaches
// nothing.
func TestNoInvokesUnlessAsked(t *testing.T) {
	for _, tc := range []struct {
		name string
		ask  bool
	}{{"not asked", false}, {"no attach", true}} {
		t.Run(tc.name, func(t *testing.T) {
			attachedAny := false
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var attach func(*Invokes) func()
				if !tc.ask {
					attach = func(*Invokes) func() { attachedAny = true; return func() {} }
				}
				Serve(w, r, slog.New(slog.NewTextHandler(io.Discard, nil)), "n1", func(nodeproto.CallAnswer) {}, attach)
			}))
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPost, srv.URL, http.NoBody)
			if tc.ask {
				req.Header.Set(nodeproto.HeaderCallInvokes, nodeproto.CallInvokesBinary)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.Header.Get(nodeproto.HeaderCallInvokes) != "" || attachedAny {
				t.Fatal("invokes offered on a stream that cannot carry them")
			}
		})
	}
}

// TestInvokesBrokenWhenTheAgentStopsReading: a stream whose agent reads
// nothing more (a connection gone silent) breaks once a write waits past
// writeTimeout, rather than holding its sender (a caller's goroutine).
func TestInvokesBrokenWhenTheAgentStopsReading(t *testing.T) {
	defer func(d time.Duration) { writeTimeout = d }(writeTimeout)
	writeTimeout = 200 * time.Millisecond
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			iv := invokesStream(t, m.onConn).iv // the invokes are never read
			big := &nodeproto.InvokeCommand{Rendezvous: "rv", Body: bytes.Repeat([]byte("x"), 1<<20), BodyInline: true}
			for i := 0; ; i++ {
				if i == 1024 { // 1 GiB: far past any socket buffer
					t.Fatal("1 GiB of frames written to an agent that reads none")
				}
				if !iv.Send(1, big) {
					break
				}
			}
			select {
			case <-iv.Broken():
			default:
				t.Fatal("a stream that refused a send is not said to be broken")
			}
		})
	}
}
