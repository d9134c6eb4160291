package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// echoServer echoes every connection and records everything it received.
type echoServer struct {
	l    net.Listener
	mu   sync.Mutex
	got  bytes.Buffer
	wg   sync.WaitGroup
	done chan struct{}
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{l: l, done: make(chan struct{})}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer c.Close()
				go func() { <-e.done; c.Close() }()
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						e.mu.Lock()
						e.got.Write(buf[:n])
						e.mu.Unlock()
						c.Write(buf[:n])
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); close(e.done); e.wg.Wait() })
	return e
}

func (e *echoServer) received() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got.String()
}

func start(t *testing.T, upstream string, opts ...Option) *Proxy {
	t.Helper()
	p, err := Start(upstream, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads len(msg) bytes back within d; it returns
// what came back and the read error.
func roundTrip(c net.Conn, msg string, d time.Duration) (string, error) {
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, len(msg))
	n, err := io.ReadFull(c, buf)
	return string(buf[:n]), err
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

func TestForwards(t *testing.T) {
	e := startEcho(t)
	p := start(t, e.l.Addr().String())
	c := dial(t, p.Addr())
	if got, err := roundTrip(c, "hello", 2*time.Second); err != nil || got != "hello" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	if s := p.Stats(); s.Accepted != 1 || s.BytesUp != 5 || s.BytesDown != 5 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCutClosesAndRefusesUntilRestore(t *testing.T) {
	e := startEcho(t)
	p := start(t, e.l.Addr().String())
	old := dial(t, p.Addr())
	if _, err := roundTrip(old, "a", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if _, err := roundTrip(old, "b", 2*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("an open connection survived the cut: %v", err)
	}
	// The kernel may complete the handshake before the proxy resets the
	// connection, so the refusal shows at the dial or at the first read.
	if refused, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second); err == nil {
		defer refused.Close()
		if _, err := roundTrip(refused, "c", 2*time.Second); err == nil || isTimeout(err) {
			t.Fatalf("a new connection was served while cut: %v", err)
		}
	}
	waitFor(t, func() bool { return p.Stats().Refused == 1 })
	p.Restore()
	fresh := dial(t, p.Addr())
	if got, err := roundTrip(fresh, "d", 2*time.Second); err != nil || got != "d" {
		t.Fatalf("after restore: %q, %v", got, err)
	}
	if s := p.Stats(); s.Refused != 1 || s.Closed != 1 {
		t.Fatalf("stats %+v", s)
	}
	if got := e.received(); got != "ad" {
		t.Fatalf("upstream received %q, want %q", got, "ad")
	}
}

func TestBlackholeHoldsThenReleases(t *testing.T) {
	e := startEcho(t)
	p := start(t, e.l.Addr().String())
	old := dial(t, p.Addr())
	if _, err := roundTrip(old, "a", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	if got, err := roundTrip(old, "b", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("forwarded during blackhole: %q, %v", got, err)
	}
	during := dial(t, p.Addr())
	during.Write([]byte("never"))
	waitFor(t, func() bool { return p.Conns() == 2 }) // accepted while blackholed
	p.Restore()
	buf := make([]byte, 1)
	old.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(old, buf); err != nil || buf[0] != 'b' {
		t.Fatalf("held data after restore: %q, %v", buf, err)
	}
	during.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := during.Read(buf); err == nil || isTimeout(err) {
		t.Fatalf("a connection opened during the blackhole survived restore: %v", err)
	}
	if got := e.received(); got != "ab" {
		t.Fatalf("upstream received %q, want %q", got, "ab")
	}
}

func TestFreezeExistingSilencesOnlyOpenConnections(t *testing.T) {
	e := startEcho(t)
	p := start(t, e.l.Addr().String())
	old := dial(t, p.Addr())
	if _, err := roundTrip(old, "a", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := p.FreezeExisting(); n != 1 {
		t.Fatalf("froze %d connections", n)
	}
	if got, err := roundTrip(old, "b", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a frozen connection answered: %q, %v", got, err)
	}
	fresh := dial(t, p.Addr())
	if got, err := roundTrip(fresh, "c", 2*time.Second); err != nil || got != "c" {
		t.Fatalf("new connection after freeze: %q, %v", got, err)
	}
	c3 := dial(t, p.Addr())
	if _, err := roundTrip(c3, "x", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if !p.FreezeConn(3) || p.FreezeConn(99) {
		t.Fatal("FreezeConn: wrong answer for an open or an unknown connection")
	}
	if got, err := roundTrip(c3, "y", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a connection frozen alone answered: %q, %v", got, err)
	}
	p.Restore() // does not thaw
	if got, err := roundTrip(old, "d", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a frozen connection answered after restore: %q, %v", got, err)
	}
	if got := e.received(); got != "acx" {
		t.Fatalf("upstream received %q, want %q", got, "acx")
	}
}

type recordingTap struct {
	mu     sync.Mutex
	data   map[Direction]*bytes.Buffer
	closed map[uint64]int
	verdct func(dir Direction, p []byte) Verdict
}

func (r *recordingTap) Data(conn uint64, dir Direction, p []byte) Verdict {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.data == nil {
		r.data = map[Direction]*bytes.Buffer{ClientToServer: {}, ServerToClient: {}}
	}
	r.data[dir].Write(p)
	if r.verdct != nil {
		return r.verdct(dir, p)
	}
	return Forward
}

func (r *recordingTap) Closed(conn uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed == nil {
		r.closed = map[uint64]int{}
	}
	r.closed[conn]++
}

func TestTapVerdicts(t *testing.T) {
	e := startEcho(t)
	tap := &recordingTap{verdct: func(dir Direction, p []byte) Verdict {
		switch {
		case dir == ClientToServer && bytes.Contains(p, []byte("drop")):
			return Close
		case dir == ServerToClient && bytes.Contains(p, []byte("last")):
			return ForwardThenClose
		}
		return Forward
	}}
	p := start(t, e.l.Addr().String(), WithTap(tap))

	c1 := dial(t, p.Addr())
	if got, err := roundTrip(c1, "ok", 2*time.Second); err != nil || got != "ok" {
		t.Fatalf("%q, %v", got, err)
	}
	if _, err := roundTrip(c1, "drop", 2*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("a dropped chunk did not close the connection: %v", err)
	}
	c2 := dial(t, p.Addr())
	if got, err := roundTrip(c2, "last", 2*time.Second); err != nil || got != "last" {
		t.Fatalf("forward-then-close did not forward: %q, %v", got, err)
	}
	c2.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c2.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("forward-then-close left the connection open: %v", err)
	}
	if got := e.received(); got != "oklast" {
		t.Fatalf("upstream received %q", got)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		tap.mu.Lock()
		n := len(tap.closed)
		tap.mu.Unlock()
		if n == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	tap.mu.Lock()
	defer tap.mu.Unlock()
	if len(tap.closed) != 2 || tap.closed[1] != 1 || tap.closed[2] != 1 {
		t.Fatalf("Closed calls %v, want once for each of 2 connections", tap.closed)
	}
	if s := p.Stats(); s.Closed != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestDelay(t *testing.T) {
	e := startEcho(t)
	p := start(t, e.l.Addr().String())
	p.SetDelay(100 * time.Millisecond)
	c := dial(t, p.Addr())
	start := time.Now()
	if _, err := roundTrip(c, "x", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("round trip took %v with 100ms each way", d)
	}
}

func TestUpstreamDownClosesClient(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	p := start(t, addr)
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "x", 2*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("a connection to a dead upstream stayed open: %v", err)
	}
	e := startEcho(t)
	p.SetUpstream(e.l.Addr().String())
	c2 := dial(t, p.Addr())
	if got, err := roundTrip(c2, "y", 2*time.Second); err != nil || got != "y" {
		t.Fatalf("after SetUpstream: %q, %v", got, err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
