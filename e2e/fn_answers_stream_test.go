package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/internal/faultproxy"
	"github.com/mercator/mercator/nodeproto"
)

// fnInvokes is the control plane's count of call attempts' commands sent
// by route (mercator_fn_invokes_total); 0 before the first.
func (c *cluster) fnInvokes(route string) float64 {
	c.t.Helper()
	v := metricSeries(c.t, c.url, c.token, fmt.Sprintf("mercator_fn_invokes_total{route=%q}", route))
	if v == "" {
		return 0
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		c.t.Fatalf("mercator_fn_invokes_total{route=%q} = %q: %v", route, v, err)
	}
	return n
}

// answersTap finds the connections that carry a call answers stream.
type answersTap struct {
	mu       sync.Mutex
	streams  []uint64
	switched map[uint64]bool // the replica took the connection (101)
}

func (a *answersTap) Data(conn uint64, dir faultproxy.Direction, p []byte) faultproxy.Verdict {
	a.mu.Lock()
	defer a.mu.Unlock()
	if dir == faultproxy.ClientToServer && bytes.Contains(p, []byte("POST "+nodeproto.PathCallAnswers)) {
		a.streams = append(a.streams, conn)
	}
	if dir == faultproxy.ServerToClient && bytes.HasPrefix(p, []byte("HTTP/1.1 101 Switching Protocols")) {
		if a.switched == nil {
			a.switched = map[uint64]bool{}
		}
		a.switched[conn] = true
	}
	return faultproxy.Forward
}

func (a *answersTap) tookConn(conn uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.switched[conn]
}

func (a *answersTap) Closed(uint64) {}

func (a *answersTap) all() []uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]uint64(nil), a.streams...)
}

// TestFunctionInvokesRideTheAnswersStream: once a node's call answers
// stream is up (on its connection, taken whole), hot calls' commands go down it (its answer) rather than the
// session, and their answers come back up it. Then the stream's connection
// is silenced with calls' commands on it and cut: the control plane sends
// those commands again down the session, and every call ends with the
// function's answer, none lost. The agent reaches its replica's calls
// through a fault proxy (the replica URL), its session directly.
func TestFunctionInvokesRideTheAnswersStream(t *testing.T) {
	tap := &answersTap{}
	proxy, err := faultproxy.Start("127.0.0.1:1", faultproxy.WithTap(tap))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	c := startClusterWith(t, 10*time.Second, func(o *daemon.ServerOptions) { o.Config.ReplicaURL = "http://" + proxy.Addr() })
	proxy.SetUpstream(strings.TrimPrefix(c.url, "http://"))
	c.startAgent("n")
	_, fn := c.deployHello("stream", api.Fn{Image: c.publish("fn-fdk"), IdleTimeout: 120, Timeout: 60})

	// Hot calls, until their commands take the stream (the first call's
	// answer opens it; the commands of calls after it has answered its
	// head go down it).
	for i := 0; c.fnInvokes("answers_stream") < 3; i++ {
		if i == 50 {
			t.Fatalf("after %d calls, %v commands went down the answers stream", i, c.fnInvokes("answers_stream"))
		}
		if status, body := c.invoke(fn.ID, `{}`); status != 200 {
			t.Fatalf("call %d = %d %q", i, status, body)
		}
	}
	streams := tap.all()
	if len(streams) != 1 {
		t.Fatalf("%d call answers streams opened, want 1", len(streams))
	}
	if !tap.tookConn(streams[0]) {
		t.Fatal("the replica did not take the stream's connection (no 101 Switching Protocols)")
	}
	t.Logf("commands by route: answers_stream %v, session %v", c.fnInvokes("answers_stream"), c.fnInvokes("session"))

	// Silence the stream, send calls down it, then cut it.
	proxy.FreezeConn(streams[0])
	before := c.fnInvokes("answers_stream")
	const calls = 3
	type result struct {
		status int
		body   string
		err    error
	}
	results := make(chan result, calls)
	for i := 0; i < calls; i++ {
		go func() {
			ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
			defer cancel()
			var out bytes.Buffer
			res, err := c.client.Invoke(ctx, fn.ID, strings.NewReader(`{}`), nil, &out)
			results <- result{res.Status, out.String(), err}
		}()
	}
	c.waitFor("the calls' commands to go down the silenced stream", func() bool { return c.fnInvokes("answers_stream") >= before+calls })
	proxy.CloseConn(streams[0])
	for i := 0; i < calls; i++ {
		r := <-results
		if r.err != nil || r.status != 200 || !strings.Contains(r.body, `"calls"`) {
			t.Errorf("call after the cut = %d %q %v", r.status, r.body, r.err)
		}
	}
	if resent := c.fnInvokes("resent"); resent != calls {
		t.Errorf("%v commands sent again down the session, want %d", resent, calls)
	}
}
