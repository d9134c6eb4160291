package limits

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// serve runs h under o's timeouts on loopback, behind Listener, and
// returns its address.
func serve(t *testing.T, o Options, h http.Handler, refused func()) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o = o.Defaults()
	srv := &http.Server{Handler: h}
	o.Server(srv)
	go srv.Serve(Listener(l, o.MaxConns, refused))
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// TestListenerClosesConnectionsOverTheCap: with a cap of 2, a third
// connection is closed at once (and counted); once one closes, a new one
// is served.
func TestListenerClosesConnectionsOverTheCap(t *testing.T) {
	var mu sync.Mutex
	refused := 0
	addr := serve(t, Options{MaxConns: 2}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		func() { mu.Lock(); refused++; mu.Unlock() })
	get := func(c net.Conn) error {
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := get(c); err != nil { // served, so accepted and counted
			t.Fatal(err)
		}
		held = append(held, c)
	}
	over, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	if err := get(over); err == nil {
		t.Fatal("a third connection was served over a cap of 2")
	}
	held[0].Close()
	for { // the server notices the close, then has a free slot
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		err = get(c)
		c.Close()
		if err == nil {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if refused == 0 {
		t.Fatal("the refused connection was not counted")
	}
}

// TestWrapRefusesOverTheShares: a caller over its share is answered 429,
// the server over its own 503, both with Retry-After and the API's error
// shape, and a declared body over the class's limit 400 before it is read.
func TestWrapRefusesOverTheShares(t *testing.T) {
	var reasons []string
	var mu sync.Mutex
	l := New(Options{MaxInFlight: 3, MaxInFlightPerCaller: 2, RetryAfter: 2 * time.Second}, Observer{Refused: func(r string) { mu.Lock(); reasons = append(reasons, r); mu.Unlock() }})
	release := make(chan struct{})
	entered := make(chan struct{}, 8)
	h := l.Wrap(API, func(r *http.Request) string { return r.Header.Get("Who") }, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	}))
	addr := serve(t, Options{}, h, nil)
	call := func(who string, body string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", strings.NewReader(body))
		req.Header.Set("Who", who)
		return http.DefaultClient.Do(req)
	}
	var wg sync.WaitGroup
	for _, who := range []string{"a", "a", "b"} { // the server's three, a's two
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := call(who, "{}")
			if err == nil {
				resp.Body.Close()
			}
		}()
		<-entered
	}
	for _, tc := range []struct{ who, body, code, retry string }{
		{"a", "{}", "429", "2"},
		{"c", "{}", "503", "2"},
		{"c", strings.Repeat(" ", int(API.Body)+1), "400", ""},
	} {
		resp, err := call(tc.who, tc.body)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if fmt.Sprint(resp.StatusCode) != tc.code || resp.Header.Get("Retry-After") != tc.retry || !strings.Contains(string(data), `"code"`) {
			t.Errorf("%s: %d, Retry-After %q, %s; want %s, Retry-After %q, the API's error shape", tc.who, resp.StatusCode, resp.Header.Get("Retry-After"), data, tc.code, tc.retry)
		}
	}
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(reasons, ","); got != "caller,overall,too_large" {
		t.Errorf("refusals reported %q, want caller,overall,too_large", got)
	}
	if n := l.requests.total; n != 0 {
		t.Errorf("%d requests still counted after all ended", n)
	}
}

// TestStreamsOutliveTheWholeRequestTimeouts: with read and write timeouts
// of 200 ms, a stream that writes every 50 ms for a second and an upload
// that sends a byte every 50 ms for a second are not cut (nor is the
// stream's context cancelled by the read deadline), while the same
// exchanges as ordinary API calls are.
func TestStreamsOutliveTheWholeRequestTimeouts(t *testing.T) {
	const timeout, tick, lasting = 200 * time.Millisecond, 50 * time.Millisecond, time.Second
	o := Options{ReadTimeout: timeout, WriteTimeout: timeout}
	l := New(o, Observer{})
	who := func(*http.Request) string { return "x" }
	streamer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := time.NewTicker(tick)
		defer t.Stop()
		for end := time.Now().Add(lasting); time.Now().Before(end); {
			select {
			case <-r.Context().Done():
				return
			case <-t.C:
			}
			if _, err := io.WriteString(w, "line\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
		io.WriteString(w, "end\n")
	})
	uploader := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "got %d\n", n)
	})
	mux := http.NewServeMux()
	mux.Handle("GET /stream", l.Wrap(Class{Name: "stream", Stream: true}, who, streamer))
	mux.Handle("GET /api-stream", l.Wrap(API, who, streamer))
	mux.Handle("PUT /upload", l.Wrap(Class{Name: "upload", Body: Unbounded, Upload: true}, who, uploader))
	mux.Handle("PUT /api-upload", l.Wrap(Class{Name: "api", Body: 1 << 20}, who, uploader))
	addr := serve(t, o, mux, nil)

	stream := func(path string) string {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		lines := strings.Count(string(data), "\n")
		if err != nil {
			return fmt.Sprintf("cut after %d lines: %v", lines, err)
		}
		return fmt.Sprintf("%d lines, ends %q", lines, data[max(0, len(data)-4):])
	}
	upload := func(path string) string {
		pr, pw := io.Pipe()
		go func() {
			t := time.NewTicker(tick)
			defer t.Stop()
			for end := time.Now().Add(lasting); time.Now().Before(end); <-t.C {
				if _, err := pw.Write([]byte("x")); err != nil {
					return
				}
			}
			pw.Close()
		}()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, "http://"+addr+path, pr)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			pr.CloseWithError(err)
			return err.Error()
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(data)))
	}
	if got := stream("/stream"); !strings.HasSuffix(got, `ends "end\n"`) {
		t.Errorf("stream class: %s; want every line and the end", got)
	}
	if got := stream("/api-stream"); strings.HasSuffix(got, `ends "end\n"`) {
		t.Errorf("api class: %s; want it cut by the write timeout", got)
	}
	if got := upload("/upload"); !strings.HasPrefix(got, "200 got ") {
		t.Errorf("upload class: %s; want the whole body read", got)
	}
	if got := upload("/api-upload"); strings.HasPrefix(got, "200") {
		t.Errorf("api class: %s; want the slow body cut by the read timeout", got)
	}
}

// BenchmarkWrapOverhead: what the limits add to a request over loopback
// HTTP (real connections, so the stream class's deadline calls reach the
// socket), beside the same request to the same handler unwrapped in the
// same run: microseconds per request and the ratio.
func BenchmarkWrapOverhead(b *testing.B) {
	l := New(Options{}, Observer{})
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	key := func(*http.Request) string { return "token:bench" }
	mux := http.NewServeMux()
	mux.Handle("/plain", ok)
	mux.Handle("/api", l.Wrap(API, key, ok))
	mux.Handle("/stream", l.Wrap(Stream, key, ok))
	mux.Handle("/node", l.Wrap(NodeEvents, key, ok))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	// Interleaved, request by request, so that the machine's load drifts
	// alike for all four.
	paths := []string{"/plain", "/api", "/stream", "/node"}
	spent := make([]time.Duration, len(paths))
	for range b.N {
		for i, path := range paths {
			start := time.Now()
			resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader("{}"))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			spent[i] += time.Since(start)
		}
	}
	us := func(i int) float64 { return float64(spent[i].Nanoseconds()) / 1e3 / float64(b.N) }
	plain := us(0)
	for i, path := range paths[1:] {
		b.ReportMetric(us(i+1)-plain, path[1:]+"-added-us/op")
		b.ReportMetric(us(i+1)/plain, path[1:]+"-ratio")
	}
	b.ReportMetric(plain, "plain-us/op")
}

// TestCheckNamesTheFlagToFix: settings that cannot work are refused with
// the flag that sets them; the defaults pass.
func TestCheckNamesTheFlagToFix(t *testing.T) {
	if err := (Options{}).Defaults().Check(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for want, o := range map[string]Options{
		"--write-timeout is -1s":        {WriteTimeout: -time.Second},
		"--node-body-budget is 1.0 MiB": {NodeBodyBudget: 1 << 20},
	} {
		if err := o.Defaults().Check(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v; want an error saying %q", o, err, want)
		}
	}
}

// TestListenerConnectionsHalfClose: a connection of the capped listener,
// taken from the server (as a call answers stream takes its own), can
// close its writing side alone: the client reads its end, and can still
// write to it.
func TestListenerConnectionsHalfClose(t *testing.T) {
	got := make(chan string, 1)
	addr := serve(t, Options{MaxConns: 2}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.WriteString("bye")
		brw.Flush()
		if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Error(err)
		}
		rest, _ := io.ReadAll(brw)
		got <- string(rest)
	}), nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if b, err := io.ReadAll(c); err != nil || string(b) != "bye" {
		t.Fatalf("read %q, %v; want bye and the server's end", b, err)
	}
	io.WriteString(c, "after")
	c.(*net.TCPConn).CloseWrite()
	if s := <-got; s != "after" {
		t.Fatalf("server read %q after its half-close, want after", s)
	}
}

// TestServerHeaderTables: a server with Options.Server's settings speaks
// HTTP/2 with its header tables bounded, and headers that repeat, and one
// larger than a table, still arrive whole on every request of a
// connection.
func TestServerHeaderTables(t *testing.T) {
	big := strings.Repeat("x", 3*HeaderTableSize)
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 || r.Header.Get("Authorization") != "Bearer token" || r.Header.Get("X-Big") != big {
			http.Error(w, fmt.Sprintf("proto %d, headers %d bytes", r.ProtoMajor, len(r.Header.Get("X-Big"))), http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Big", big)
	}))
	ts.EnableHTTP2 = true
	Options{}.Defaults().Server(ts.Config)
	if ts.Config.HTTP2.MaxDecoderHeaderTableSize != HeaderTableSize || ts.Config.HTTP2.MaxEncoderHeaderTableSize != HeaderTableSize {
		t.Fatalf("HTTP/2 config %+v", ts.Config.HTTP2)
	}
	ts.StartTLS()
	defer ts.Close()
	c := ts.Client()
	for i := range 5 {
		req, _ := http.NewRequest("GET", ts.URL, nil)
		req.Header.Set("Authorization", "Bearer token")
		req.Header.Set("X-Big", big)
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || res.ProtoMajor != 2 || res.Header.Get("X-Big") != big {
			t.Fatalf("request %d: %s %s %q", i, res.Proto, res.Status, body)
		}
	}
}
