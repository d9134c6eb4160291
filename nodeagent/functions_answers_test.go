package nodeagent

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// answersTestAgent is an agent with a Functions side (no engine: these
// tests drive its answers alone) whose session credential is set, and a
// context that ends with the test.
func answersTestAgent(t *testing.T) (*Agent, context.Context) {
	t.Helper()
	state, err := OpenState(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := state.Enrolled("n1", nodeproto.Enrollment{NodeID: "n1", SessionToken: "tok", FencingToken: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return New(Identity{NodeID: "n1"}, nil, nil, state, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		WithFunctions(nil, FunctionShare{})), ctx
}

// answerHead answers a call answers stream's head at once (full duplex),
// saying invokes may come down the answer when invokes is set.
func answerHead(w http.ResponseWriter, invokes bool) *http.ResponseController {
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex()
	if invokes {
		w.Header().Set(nodeproto.HeaderCallInvokes, nodeproto.CallInvokesBinary)
	}
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	return rc
}

// readAnswers sends each frame of a call answers stream's body to frames,
// with a body of its own, until the body ends.
func readAnswers(body io.Reader, frames chan<- nodeproto.CallAnswer) {
	br := bufio.NewReader(body)
	var buf []byte
	for {
		a, next, err := nodeproto.ReadCallAnswer(br, buf)
		if err != nil {
			return
		}
		buf = next
		a.Body = append([]byte(nil), a.Body...)
		frames <- a
	}
}

// TestAnswersRideTheStream: with the command allowing it, whole answers
// go as frames on one stream to the command's replica, authenticated as
// the node, once the replica answered the stream's head; before that,
// and for a command that does not allow it, the answer is posted.
func TestAnswersRideTheStream(t *testing.T) {
	frames := make(chan nodeproto.CallAnswer, 4)
	var opens, declined atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != nodeproto.PathCallAnswers || r.Header.Get(nodeproto.HeaderNodeID) != "n1" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "unexpected "+r.URL.Path, http.StatusBadRequest)
			return
		}
		if asksConn(r) {
			declined.Add(1) // as a replica that predates it: an answer, and the empty body read
			answerHead(w, false)
			io.Copy(io.Discard, r.Body)
			return
		}
		opens.Add(1)
		answerHead(w, false)
		readAnswers(r.Body, frames)
	}))
	t.Cleanup(srv.Close) // after the agent's context ends (cleanups run last first)
	a, ctx := answersTestAgent(t)
	f := a.functions
	inv := nodeproto.InvokeCommand{Rendezvous: "rv-1", URL: srv.URL, AnswerStream: true}
	ok := nodeproto.CallAnswer{Status: 201, Header: map[string][]string{"Content-Type": {"text/plain"}}, Body: []byte("made")}

	if f.answerOnStream(ctx, a, nodeproto.InvokeCommand{Rendezvous: "rv-0", URL: srv.URL}, ok) {
		t.Fatal("a command without AnswerStream rode the stream")
	}
	if f.answerOnStream(ctx, a, inv, ok) {
		t.Fatal("an answer rode a stream whose head had not come back")
	}
	<-f.answers[srv.URL].opened
	if !f.answerOnStream(ctx, a, inv, ok) {
		t.Fatal("an answer was not taken by the open stream")
	}
	inv.Rendezvous = "rv-2"
	if !f.answerOnStream(ctx, a, inv, nodeproto.CallAnswer{ErrorKind: "busy", ErrorMessage: "no container free"}) {
		t.Fatal("an error was not taken by the open stream")
	}
	bad := nodeproto.CallAnswer{Status: 200, Header: map[string][]string{"X": {"a\nb"}}}
	if f.answerOnStream(ctx, a, inv, bad) {
		t.Fatal("a header no frame may carry rode the stream (it would end it)")
	}
	want := ok
	want.Rendezvous = "rv-1"
	if got := <-frames; !reflect.DeepEqual(got, want) {
		t.Fatalf("first frame %+v, want %+v", got, want)
	}
	if got := <-frames; got.Rendezvous != "rv-2" || got.ErrorKind != "busy" || got.ErrorMessage != "no container free" {
		t.Fatalf("second frame %+v", got)
	}
	if n, d := opens.Load(), declined.Load(); n != 1 || d != 1 {
		t.Fatalf("%d streams opened after %d declined connections, want 1 after 1", n, d)
	}
	// A new stream to the replica that declined goes on a body at once.
	f.answers[srv.URL].fail(a.now(), 0)
	f.answerOnStream(ctx, a, inv, ok)
	<-f.answers[srv.URL].opened
	if n, d := opens.Load(), declined.Load(); n != 2 || d != 1 {
		t.Fatalf("%d streams opened after %d declined connections, want 2 after 1: the replica was asked again", n, d)
	}
}

// asksConn reports whether r asks for the stream's connection
// (nodeproto.CallAnswersUpgrade).
func asksConn(r *http.Request) bool { return r.Header.Get("Upgrade") == nodeproto.CallAnswersUpgrade }

// TestAnswersPostedToAnOlderControlPlane: a replica that does not serve
// the stream (404) gets posts, and is not asked again at every call.
func TestAnswersPostedToAnOlderControlPlane(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close) // after the agent's context ends (cleanups run last first)
	a, ctx := answersTestAgent(t)
	f := a.functions
	inv := nodeproto.InvokeCommand{Rendezvous: "rv-1", URL: srv.URL, AnswerStream: true}
	ans := nodeproto.CallAnswer{Status: 200}
	if f.answerOnStream(ctx, a, inv, ans) {
		t.Fatal("an answer rode a stream still opening")
	}
	<-f.answers[srv.URL].opened
	for i := 0; i < 5; i++ {
		if f.answerOnStream(ctx, a, inv, ans) {
			t.Fatal("an answer rode a refused stream")
		}
	}
	if n := hits.Load(); n != 1 {
		t.Fatalf("the refusing replica was asked %d times, want once until answersRetry", n)
	}
}

// TestInvokesComeDownTheStream: a replica that echoes
// nodeproto.HeaderCallInvokes may write invoke frames down the stream's
// answer; the agent runs each as one from its session (here one fenced
// below the node's token, which it refuses), once however often it comes,
// and its answer rides the same stream back. A replica that does not echo
// the header gets nothing of the kind read from its answer.
func TestInvokesComeDownTheStream(t *testing.T) {
	frames := make(chan nodeproto.CallAnswer, 4)
	asked := make(chan bool, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != nodeproto.PathCallAnswers {
			t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
			http.NotFound(w, r)
			return
		}
		if asksConn(r) {
			answerHead(w, true) // a replica that predates it
			io.Copy(io.Discard, r.Body)
			return
		}
		asked <- r.Header.Get(nodeproto.HeaderCallInvokes) == nodeproto.CallInvokesBinary
		rc := answerHead(w, true)
		inv := &nodeproto.InvokeCommand{CallID: "c-9", Rendezvous: "rv-9", URL: "http://" + r.Host, AnswerStream: true}
		frame := nodeproto.AppendInvokeFrame(nil, 0, inv)
		w.Write(append(frame, frame...)) // the same command twice
		_ = rc.Flush()
		readAnswers(r.Body, frames)
	}))
	t.Cleanup(srv.Close) // after the agent's context ends (cleanups run last first)
	a, ctx := answersTestAgent(t)
	f := a.functions
	f.answerOnStream(ctx, a, nodeproto.InvokeCommand{Rendezvous: "rv-1", URL: srv.URL, AnswerStream: true}, nodeproto.CallAnswer{Status: 200})
	if !<-asked {
		t.Fatal("the stream's request did not ask for invokes")
	}
	got := <-frames
	if got.Rendezvous != "rv-9" || got.ErrorKind != "refused" || !strings.Contains(got.ErrorMessage, "fenced at token 0") {
		t.Fatalf("answer %+v, want rv-9 refused as fenced", got)
	}
	select {
	case again := <-frames:
		t.Fatalf("a second answer %+v: the command ran twice", again)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestAnswersRideTheConnection: a replica that takes the stream's
// connection (nodeproto.CallAnswersUpgrade) gets the answer frames on it
// and writes invokes onto it; the agent runs each once, its answer riding
// the connection back. At its idle end the agent closes its side only, so
// an invoke the replica wrote meanwhile is still read and run (its answer
// posted: the stream takes no more), and the next answer opens a new
// connection. Nothing went on a request body.
func TestAnswersRideTheConnection(t *testing.T) {
	frames := make(chan nodeproto.CallAnswer, 8)
	posted := make(chan string, 8)
	closedByAgent := make(chan struct{})
	var conns, bodies atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/response") {
			posted <- r.URL.Path
			return
		}
		if !asksConn(r) || r.Header.Get(nodeproto.HeaderCallInvokes) != nodeproto.CallInvokesBinary {
			bodies.Add(1)
			http.Error(w, "not on the connection", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + nodeproto.CallAnswersUpgrade +
			"\r\n" + nodeproto.HeaderCallInvokes + ": " + nodeproto.CallInvokesBinary + "\r\n\r\n")
		first := conns.Add(1) == 1
		invoke := func(rv string) []byte {
			return nodeproto.AppendInvokeFrame(nil, 0, &nodeproto.InvokeCommand{CallID: "c-" + rv, Rendezvous: rv, URL: "http://" + r.Host, AnswerStream: true})
		}
		if first {
			frame := invoke("rv-9")
			brw.Write(append(frame, frame...)) // the same command twice
		}
		brw.Flush()
		readAnswers(brw.Reader, frames) // until the agent closes its side
		if first {
			close(closedByAgent)
			conn.Write(invoke("rv-10")) // written after the agent's end
			conn.(*net.TCPConn).CloseWrite()
			io.Copy(io.Discard, conn)
		}
	}))
	t.Cleanup(srv.Close)
	a, ctx := answersTestAgent(t)
	f := a.functions
	f.answersIdle = 200 * time.Millisecond
	inv := nodeproto.InvokeCommand{Rendezvous: "rv-1", URL: srv.URL, AnswerStream: true}
	f.answerOnStream(ctx, a, inv, nodeproto.CallAnswer{Status: 200})
	<-f.answers[srv.URL].opened
	if !f.answerOnStream(ctx, a, inv, nodeproto.CallAnswer{Status: 201}) {
		t.Fatal("an answer was not taken by the stream on the connection")
	}
	got := map[string]nodeproto.CallAnswer{}
	for range 2 {
		a := <-frames
		got[a.Rendezvous] = a
	}
	if got["rv-1"].Status != 201 || got["rv-9"].ErrorKind != "refused" {
		t.Fatalf("frames %+v, want rv-1's answer and rv-9 refused as fenced", got)
	}
	<-closedByAgent
	if p := <-posted; p != nodeproto.PathCalls+"rv-10/response" {
		t.Fatalf("posted %s, want rv-10's answer: the invoke written after the agent's end must run", p)
	}
	select {
	case extra := <-frames:
		t.Fatalf("another frame %+v: rv-9 ran twice, or an answer rode an ended stream", extra)
	case p := <-posted:
		t.Fatalf("another post %s", p)
	case <-time.After(100 * time.Millisecond):
	}
	// The next answer opens a new connection.
	waitUntil(t, "a second connection", func() bool {
		f.answerOnStream(ctx, a, inv, nodeproto.CallAnswer{Status: 202})
		return conns.Load() == 2
	})
	if n := bodies.Load(); n != 0 {
		t.Fatalf("%d streams on a request body, want none", n)
	}
}
