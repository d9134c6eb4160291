package daemon

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/nodeproto"
)

// The resource-exhaustion suite (issue 16, "Bounded servers"): a real
// control plane (RunServer, SQLite) on loopback with short timeouts,
// attacked by slow and idle clients (this file), oversized node bodies and
// one credential's flood (bounded_flood_test.go). Figures are logged with
// t.Logf; docs/hardening.md quotes them.

// testLimits are short timeouts, so that the suite takes seconds.
var testLimits = controlplane.Limits{ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second,
	WriteTimeout: 2 * time.Second, IdleTimeout: time.Second}

// attack is one kind of client that holds a connection without finishing
// with it.
type attack struct {
	name    string
	timeout time.Duration // the limit that must close it
	// open starts the connection's attack; drip, when set, is what the
	// client sends every tick afterwards to look alive.
	open func(c net.Conn) error
	drip string
}

// TestSlowAndIdleClientsAreClosed: 200 clients sending their headers a
// byte at a time, 200 sending their bodies a byte at a time, and 200
// keep-alive connections left idle are all closed by the server (the
// client reads to the end of the stream: EOF or reset, never its own
// guard), each after the limit that applies to it, and the server's
// goroutines come back to where they were.
func TestSlowAndIdleClientsAreClosed(t *testing.T) {
	n := 200
	if testing.Short() {
		n = 50
	}
	url, _ := startServer(t, ServerOptions{Config: controlplane.Config{Limits: testLimits}})
	addr := strings.TrimPrefix(url, "http://")
	attacks := []attack{
		{name: "slow headers", timeout: testLimits.ReadHeaderTimeout, drip: "a",
			open: func(c net.Conn) error {
				_, err := io.WriteString(c, "POST "+nodeproto.PathEnroll+" HTTP/1.1\r\nHost: x\r\nX-Drip: ")
				return err
			}},
		{name: "slow body", timeout: testLimits.ReadTimeout, drip: " ",
			open: func(c net.Conn) error {
				_, err := io.WriteString(c, "POST "+nodeproto.PathEnroll+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{")
				return err
			}},
		{name: "idle keep-alive", timeout: testLimits.IdleTimeout,
			open: func(c net.Conn) error {
				if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					return err
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
					return fmt.Errorf("healthz: %d %v", resp.StatusCode, err)
				}
				return nil // the connection is now idle, kept alive
			}},
	}
	runtime.GC()
	before := runtime.NumGoroutine()
	results := make([]chan closed, len(attacks))
	stop := make(chan struct{})
	defer close(stop)
	for i, a := range attacks {
		results[i] = runAttack(t, addr, a, n, stop)
	}
	held := runtime.NumGoroutine()
	for i, a := range attacks {
		var byServer int
		var slowest, fastest time.Duration
		for range n {
			c := <-results[i]
			if c.err != nil {
				t.Errorf("%s: %v", a.name, c.err)
				continue
			}
			byServer++
			slowest = max(slowest, c.after)
			if fastest == 0 || c.after < fastest {
				fastest = c.after
			}
		}
		t.Logf("%s: %d/%d closed by the server, %.2f–%.2f s after the attack began (limit %v)", a.name, byServer, n, fastest.Seconds(), slowest.Seconds(), a.timeout)
		if byServer < n {
			t.Errorf("%s: %d of %d connections were not closed by the server", a.name, n-byServer, n)
		}
		if fastest < a.timeout/2 {
			t.Errorf("%s: a connection was closed after %v, well before its limit %v: closed by something else", a.name, fastest, a.timeout)
		}
	}
	after := settledGoroutines(before)
	t.Logf("goroutines: %d before, %d while %d connections were held (%d of them this test's clients), %d after", before, held, len(attacks)*n, len(attacks)*n+len(attacks), after)
}

// closed is how one attacking connection ended: after how long since its
// attack began, or err when the server did not close it (the client's
// guard, many times the limit, ran out first) or the attack failed.
type closed struct {
	after time.Duration
	err   error
}

// runAttack opens n connections running a and reports each one's end on
// the channel. A ticker sends a.drip on every connection still open.
func runAttack(t *testing.T, addr string, a attack, n int, stop <-chan struct{}) chan closed {
	out := make(chan closed, n)
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("%s: dial: %v", a.name, err)
		}
		t.Cleanup(func() { c.Close() })
		if err := a.open(c); err != nil {
			t.Fatalf("%s: %v", a.name, err)
		}
		began := time.Now()
		mu.Lock()
		open[c] = true
		mu.Unlock()
		go func() {
			guard := 5*a.timeout + 5*time.Second
			c.SetReadDeadline(began.Add(guard))
			_, err := io.Copy(io.Discard, c) // the server's answer, if any, then the end
			mu.Lock()
			delete(open, c)
			mu.Unlock()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				out <- closed{err: fmt.Errorf("still open after %v (limit %v)", guard, a.timeout)}
				return
			}
			out <- closed{after: time.Since(began)}
		}()
	}
	if a.drip != "" {
		go func() {
			tick := time.NewTicker(a.timeout / 5)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				mu.Lock()
				for c := range open {
					c.SetWriteDeadline(time.Now().Add(time.Second))
					io.WriteString(c, a.drip) // fails once the server closed it
				}
				mu.Unlock()
			}
		}()
	}
	return out
}

// settledGoroutines waits for this process's goroutines to come back to
// within a few of want (the server's per-connection goroutines end once
// their connections are closed), giving up after ten seconds; it returns
// the count it saw last.
func settledGoroutines(want int) int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.Gosched()
		n := runtime.NumGoroutine()
		if n <= want+5 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestUploadsAreBoundByProgress: an upload may take longer than the read
// timeout as long as its bytes keep coming (one every fifth of the
// timeout, for three timeouts, is read whole), and one that stalls is
// closed by the server once a read timeout passes without a byte.
func TestUploadsAreBoundByProgress(t *testing.T) {
	url, admin := startServer(t, ServerOptions{Config: controlplane.Config{Limits: testLimits}})
	addr := strings.TrimPrefix(url, "http://")
	const size = 15
	put := func(stall bool) (answer string, after time.Duration) {
		body, _ := json.Marshal(api.UploadRequest{Size: 1 << 20})
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/artifacts/slow/uploads", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+admin)
		req.Close = true // no pooled connection for the 1 s idle timeout to close under it
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var up api.Upload
		json.NewDecoder(resp.Body).Decode(&up)
		resp.Body.Close()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "PUT /v1/uploads/%s?offset=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", up.ID, admin, size)
		began := time.Now()
		tick := time.NewTicker(testLimits.ReadTimeout / 5)
		defer tick.Stop()
		for i := 0; i < size && !stall; i++ {
			<-tick.C // the client's pace, not a wait for the server
			c.Write([]byte("x"))
		}
		c.SetReadDeadline(time.Now().Add(5*testLimits.ReadTimeout + 5*time.Second)) // the guard
		data, err := io.ReadAll(c)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return "still open: " + string(data), time.Since(began)
		}
		line, _, _ := strings.Cut(string(data), "\r\n")
		return line, time.Since(began) // the answer, then the idle timeout's close
	}
	moving, tookMoving := put(false)
	stalled, tookStalled := put(true)
	t.Logf("an upload sending a byte every %v: %q after %.2f s; one that stalls: %q after %.2f s (read timeout %v)",
		testLimits.ReadTimeout/5, moving, tookMoving.Seconds(), stalled, tookStalled.Seconds(), testLimits.ReadTimeout)
	if !strings.Contains(moving, " 200 ") && !strings.Contains(moving, " 204 ") {
		t.Errorf("a slow upload that kept moving was answered %q; want it read whole", moving)
	}
	if strings.HasPrefix(stalled, "still open") || strings.Contains(stalled, " 200 ") {
		t.Errorf("a stalled upload: %q; want it closed by the server", stalled)
	}
}
