package callconn

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// server is an HTTP server on a unix socket that counts the connections
// it accepted.
type server struct {
	sock     string
	accepted atomic.Int64
	srv      *http.Server
}

func startServer(t *testing.T, h http.HandlerFunc) *server {
	t.Helper()
	s := &server{sock: filepath.Join(t.TempDir(), "lsnr.sock")}
	l, err := net.Listen("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	s.srv = &http.Server{Handler: h, ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.accepted.Add(1)
		}
	}}
	go s.srv.Serve(l)
	t.Cleanup(func() { s.srv.Close() })
	return s
}

func (s *server) client(idle time.Duration) *Client {
	return New(Config{
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", s.sock)
		},
		Idle:           idle,
		MaxHeaderBytes: 1 << 20,
	})
}

func echo(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("X-Call", r.Header.Get("Fn-Call-Id"))
	fmt.Fprintf(w, "%s %s", r.Method, b)
}

func post(ctx context.Context, body io.Reader, length int64, id string) *http.Request {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://localhost/call", body)
	if err != nil {
		panic(err)
	}
	req.ContentLength = length
	req.Header.Set("Fn-Call-Id", id)
	return req
}

// call makes one call and reads its response whole.
func call(t *testing.T, cl *Client, body string, id string) (string, http.Header) {
	t.Helper()
	resp, err := cl.RoundTrip(post(context.Background(), strings.NewReader(body), int64(len(body)), id))
	if err != nil {
		t.Fatalf("call %s: %v", id, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("call %s body: %v", id, err)
	}
	return string(b), resp.Header
}

func TestCallsShareOneConnection(t *testing.T) {
	s := startServer(t, echo)
	cl := s.client(time.Minute)
	defer cl.Close()
	for i := range 50 {
		id := fmt.Sprint("c", i)
		got, h := call(t, cl, "body"+id, id)
		if got != "POST body"+id || h.Get("X-Call") != id {
			t.Fatalf("call %d: %q, X-Call %q", i, got, h.Get("X-Call"))
		}
	}
	if n := s.accepted.Load(); n != 1 {
		t.Fatalf("%d connections for 50 calls in turn, want 1", n)
	}
}

func TestConcurrentCallsTakeTurns(t *testing.T) {
	var inFlight, most atomic.Int64
	s := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(time.Millisecond)
		inFlight.Add(-1)
		echo(w, r)
	})
	cl := s.client(time.Minute)
	defer cl.Close()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 10 {
				id := fmt.Sprint(g, "-", i)
				if got, _ := call(t, cl, id, id); got != "POST "+id {
					t.Errorf("call %s: %q", id, got)
				}
			}
		})
	}
	wg.Wait()
	if most.Load() != 1 || s.accepted.Load() != 1 {
		t.Fatalf("%d calls at once on %d connections, want 1 on 1", most.Load(), s.accepted.Load())
	}
}

func TestBodyClosedEarlyDropsTheConnection(t *testing.T) {
	s := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte("x"), 100<<10))
	})
	cl := s.client(time.Minute)
	defer cl.Close()
	resp, err := cl.RoundTrip(post(context.Background(), http.NoBody, 0, "a"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Read(make([]byte, 10))
	resp.Body.Close()
	if got, _ := call(t, cl, "", "b"); len(got) != 100<<10 {
		t.Fatalf("next call read %d bytes, want %d", len(got), 100<<10)
	}
	if n := s.accepted.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: the half-read one must not be reused", n)
	}
}

func TestContextEndInterruptsTheCall(t *testing.T) {
	release := make(chan struct{})
	s := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Fn-Call-Id") == "slow-head" {
			<-release
		}
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		if r.Header.Get("Fn-Call-Id") == "slow-body" {
			<-release
		}
		io.WriteString(w, "done")
	})
	defer close(release)
	cl := s.client(time.Minute)
	defer cl.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := cl.RoundTrip(post(ctx, http.NoBody, 0, "slow-head")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting for the head past the deadline: %v, want DeadlineExceeded", err)
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	resp, err := cl.RoundTrip(post(ctx2, http.NoBody, 0, "slow-body"))
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(20*time.Millisecond, cancel2)
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("reading a body whose call was canceled ended without an error")
	}
	resp.Body.Close()

	if got, _ := call(t, cl, "", "after"); got != "done" {
		t.Fatalf("call after two interrupted ones: %q", got)
	}
	if n := s.accepted.Load(); n != 3 {
		t.Fatalf("%d connections, want 3 (neither interrupted one reused)", n)
	}
}

func TestContextEndedWhileWaitingForTheTurn(t *testing.T) {
	s := startServer(t, echo)
	cl := s.client(time.Minute)
	defer cl.Close()
	held, err := cl.RoundTrip(post(context.Background(), http.NoBody, 0, "held"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := cl.RoundTrip(post(ctx, http.NoBody, 0, "waits")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call waiting behind an unfinished one: %v, want DeadlineExceeded", err)
	}
	io.ReadAll(held.Body)
	held.Body.Close()
	if got, _ := call(t, cl, "x", "next"); got != "POST x" {
		t.Fatalf("next call: %q", got)
	}
}

func TestIdleConnectionIsNotReused(t *testing.T) {
	s := startServer(t, echo)
	cl := s.client(30 * time.Millisecond)
	defer cl.Close()
	call(t, cl, "", "a")
	call(t, cl, "", "b")
	time.Sleep(60 * time.Millisecond)
	call(t, cl, "", "c")
	if n := s.accepted.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: one before the idle pause, one after", n)
	}
	cl.CloseIdle()
	call(t, cl, "", "d")
	if n := s.accepted.Load(); n != 3 {
		t.Fatalf("%d connections after CloseIdle, want 3", n)
	}
}

// rawServer serves each connection on the unix socket with handle.
func rawServer(t *testing.T, handle func(n int, c net.Conn)) (sock string, conns *atomic.Int64) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "lsnr.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	conns = new(atomic.Int64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go handle(int(conns.Add(1)), c)
		}
	}()
	return sock, conns
}

func rawClient(sock string) *Client {
	return New(Config{
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		Idle:           time.Minute,
		MaxHeaderBytes: 4 << 10,
	})
}

const okResponse = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// answerEach reads c's requests in turn, each whole, and writes reply(i)
// to the i-th (from 1); it closes c once reply says "" (the request read
// but never answered), or after the first answer when once.
func answerEach(c net.Conn, once bool, reply func(i int) string) {
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 1; ; i++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		r := reply(i)
		if r == "" {
			return
		}
		io.WriteString(c, r)
		if once {
			return
		}
	}
}

// A connection the container closed while idle fails the next request's
// write; the request is sent again on a new one, and served once.
func TestClosedWhileIdleIsSentAgain(t *testing.T) {
	var served atomic.Int64
	sock, conns := rawServer(t, func(n int, c net.Conn) {
		answerEach(c, true, func(int) string { served.Add(1); return okResponse }) // then closed while idle
	})
	cl := rawClient(sock)
	defer cl.Close()
	call(t, cl, "one", "a")
	time.Sleep(20 * time.Millisecond) // the close reaches the client's socket
	if got, _ := call(t, cl, "two", "b"); got != "ok" {
		t.Fatalf("second call: %q", got)
	}
	if served.Load() != 2 || conns.Load() != 2 {
		t.Fatalf("%d served on %d connections, want 2 on 2", served.Load(), conns.Load())
	}
}

// A container that reads the request and then closes without answering
// may have run the call: it is not sent again.
func TestReadButUnansweredIsNotSentAgain(t *testing.T) {
	var read atomic.Int64
	sock, _ := rawServer(t, func(n int, c net.Conn) {
		answerEach(c, false, func(int) string {
			if read.Add(1) == 2 {
				return "" // the second call dies unanswered
			}
			return okResponse
		})
	})
	cl := rawClient(sock)
	defer cl.Close()
	call(t, cl, "", "a")
	if _, err := cl.RoundTrip(post(context.Background(), strings.NewReader("x"), 1, "b")); err == nil {
		t.Fatal("a call the container read and never answered succeeded")
	}
	if n := read.Load(); n != 2 {
		t.Fatalf("the container read %d requests, want 2: the unanswered one must not be sent again", n)
	}
}

func TestHeadersBounded(t *testing.T) {
	sock, _ := rawServer(t, func(n int, c net.Conn) {
		defer c.Close()
		http.ReadRequest(bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Big: "+strings.Repeat("a", 64<<10)+"\r\nContent-Length: 0\r\n\r\n")
	})
	cl := rawClient(sock)
	defer cl.Close()
	_, err := cl.RoundTrip(post(context.Background(), http.NoBody, 0, "a"))
	if err == nil || !strings.Contains(err.Error(), "exceed 4096 bytes") {
		t.Fatalf("64 KiB of headers with a 4 KiB bound: %v", err)
	}
}

func TestInformationalResponsesSkipped(t *testing.T) {
	sock, _ := rawServer(t, func(n int, c net.Conn) {
		answerEach(c, false, func(int) string {
			return "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + okResponse
		})
	})
	cl := rawClient(sock)
	defer cl.Close()
	for _, id := range []string{"a", "b"} {
		if got, _ := call(t, cl, "x", id); got != "ok" {
			t.Fatalf("call %s: %q", id, got)
		}
	}
}

func TestConnectionCloseIsHonoured(t *testing.T) {
	sock, conns := rawServer(t, func(n int, c net.Conn) {
		answerEach(c, true, func(int) string { return "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end" })
	})
	cl := rawClient(sock)
	defer cl.Close()
	for _, id := range []string{"a", "b"} {
		if got, _ := call(t, cl, "", id); got != "until the end" {
			t.Fatalf("call %s: %q", id, got)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// A streamed body of unknown length goes chunked, written beside the
// response's read; a container that answers before reading it all is
// heard, and its connection is not reused.
func TestStreamedBodies(t *testing.T) {
	s := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Fn-Call-Id") == "early" {
			w.Header().Set("Connection", "keep-alive")
			io.WriteString(w, "too big")
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%d %v", n, r.TransferEncoding)
	})
	cl := s.client(time.Minute)
	defer cl.Close()

	pr, pw := io.Pipe()
	go func() {
		for range 64 {
			pw.Write(bytes.Repeat([]byte("y"), 4<<10))
		}
		pw.Close()
	}()
	resp, err := cl.RoundTrip(post(context.Background(), pr, -1, "chunked"))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != "262144 [chunked]" {
		t.Fatalf("chunked body: %q", got)
	}

	big := bytes.NewReader(make([]byte, 8<<20))
	resp, err = cl.RoundTrip(post(context.Background(), big, int64(big.Len()), "early"))
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != "too big" {
		t.Fatalf("early answer: %q", got)
	}
	before := s.accepted.Load()
	if got, _ := call(t, cl, "z", "after"); !strings.HasPrefix(got, "1 ") {
		t.Fatalf("call after an early answer: %q", got)
	}
	if s.accepted.Load() != before+1 {
		t.Fatal("the connection of a request not read whole was reused")
	}
}

// A body that fails while it is written fails the call with its own
// error, and the connection is not reused.
func TestBodyReadErrorFailsTheCall(t *testing.T) {
	s := startServer(t, echo)
	cl := s.client(time.Minute)
	defer cl.Close()
	boom := errors.New("boom")
	body := io.MultiReader(strings.NewReader("part"), errReader{boom})
	if _, err := cl.RoundTrip(post(context.Background(), body, -1, "a")); !errors.Is(err, boom) {
		t.Fatalf("a body that fails: %v, want its error", err)
	}
	if got, _ := call(t, cl, "ok", "b"); got != "POST ok" {
		t.Fatalf("next call: %q", got)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestClosedClientRefusesCalls(t *testing.T) {
	s := startServer(t, echo)
	cl := s.client(time.Minute)
	call(t, cl, "", "a")
	cl.Close()
	if _, err := cl.RoundTrip(post(context.Background(), http.NoBody, 0, "b")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a call after Close: %v, want net.ErrClosed", err)
	}
	// and the turn was given back
	if _, err := cl.RoundTrip(post(context.Background(), http.NoBody, 0, "c")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a second call after Close: %v", err)
	}
}

func TestDialErrorGivesTheTurnBack(t *testing.T) {
	fails := errors.New("no listener")
	cl := New(Config{Dial: func(context.Context) (net.Conn, error) { return nil, fails }, Idle: time.Minute, MaxHeaderBytes: 1 << 10})
	for range 3 {
		if _, err := cl.RoundTrip(post(context.Background(), http.NoBody, 0, "a")); !errors.Is(err, fails) {
			t.Fatalf("dial failure: %v", err)
		}
	}
}
