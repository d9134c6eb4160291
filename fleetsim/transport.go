package fleetsim

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/pki"
)

// routerDomain is the made-up domain of the control-plane addresses agents
// are given: agent i talks to "cp-K.fleetsim" with K = i mod replicas, and
// router resolves the name to replica K, or to the next replica that
// accepts a connection when K does not (as a load balancer in front of
// replicas would), so killing a replica moves its agents to another.
const routerDomain = ".fleetsim"

func replicaHost(k int) string { return "cp-" + strconv.Itoa(k) + routerDomain }

// router dials the replicas. It spreads connections over several loopback
// source addresses: with one, the kernel's ephemeral port range (about
// 28,000 ports) would cap how many agents can hold a session at once.
type router struct {
	addrs  []string // replica i's host:port
	byAddr map[string]int
	src    []*net.TCPAddr
	next   atomic.Uint64
}

func newRouter(addrs []string) *router {
	r := &router{addrs: addrs, byAddr: map[string]int{}}
	for i, a := range addrs {
		r.byAddr[a] = i
	}
	for i := 2; i < 34; i++ {
		r.src = append(r.src, &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(i))})
	}
	return r
}

func (r *router) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	k, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(host, "cp-"), routerDomain))
	if err != nil || !strings.HasSuffix(host, routerDomain) {
		return nil, fmt.Errorf("fleetsim router: unknown host %q", host)
	}
	var last error
	for j := range r.addrs {
		target := r.addrs[(k+j)%len(r.addrs)]
		d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: r.src[r.next.Add(1)%uint64(len(r.src))]}
		c, err := d.DialContext(ctx, "tcp", target)
		if err == nil {
			return c, nil
		}
		last = err
	}
	return nil, last
}

// idleConns bounds the idle connections a group of agents keeps per
// replica. Heartbeats and event batches reuse them; more would only pile up
// after a burst (the fleet enrolling) and cost the control plane a
// descriptor each.
const idleConns = 256

// agentClients hands each simulated agent its HTTP client. Over TLS (the
// default) every agent gets a client of its own, the real agent's
// (daemon.AgentHTTPClient: HTTP/2 by ALPN, exactly the run's CA, its own
// TLS session cache), so each node holds one connection carrying its
// session stream and its calls, and a reconnect storm costs the control
// plane what a real fleet's would: one resumed handshake a node. In
// plaintext, and with shared (the --http2 mode), the agents of one process
// share clients (agentClient: one for the process over HTTP/1.1, one per
// nodesPerConn agents over HTTP/2), which fits a fleet the open-file limit
// would not otherwise allow.
type agentClients struct {
	shared bool // agents share clients (plaintext, or the --http2 mode)
	http2  bool
	// groups are the shared clients, one per nodesPerConn agents over
	// HTTP/2 (one for the process otherwise); started counts the agents
	// handed one.
	groups  []*http.Client
	started int
	own     []*http.Client
	router  *router
	roots   []*x509.Certificate
	obs     *observer
}

// nodesPerConn is how many simulated agents share one HTTP/2 client, so
// one connection per replica. Go's HTTP/2 client opens a second connection
// only once the server's stream limit is reached (65,536 by default), so a
// process's 12,500 agents shared one connection, and every stream's writes
// queued behind one TLS connection and one server goroutine: at 50,000
// nodes the control plane spent its time on that queue, which no real fleet
// (one connection per agent) has. Fewer agents a connection still cost
// what no real fleet pays: Go's HTTP/2 server picks each frame to write by
// walking every open stream of the connection (its round-robin write
// scheduler), so a write costs in proportion to the streams sharing it. At
// 250 agents a connection that walk was 10% of the control plane's CPU
// while 50,000 nodes enrolled on PostgreSQL; 50 a connection keeps it
// small, and 50,000 nodes at 1,000 clients, each with a connection to each
// replica it talks to, under the open-file limit.
const nodesPerConn = 50

func newAgentClients(r *router, shared bool, roots []*x509.Certificate, obs *observer) *agentClients {
	return &agentClients{shared: roots == nil || shared, http2: shared, router: r, roots: roots, obs: obs}
}

// next is the client of the next agent to start.
func (c *agentClients) next() *http.Client {
	if c.shared {
		if len(c.groups) == 0 || (c.http2 && c.started%nodesPerConn == 0) {
			c.groups = append(c.groups, agentClient(c.router, c.http2, c.roots, c.obs))
		}
		c.started++
		return c.groups[len(c.groups)-1]
	}
	hc := daemon.AgentHTTPClient(c.roots, c.router.dial)
	o := c.obs.around(hc.Transport)
	c.own = append(c.own, hc)
	return &http.Client{Transport: o}
}

func (c *agentClients) closeIdle() {
	for _, hc := range c.groups {
		hc.CloseIdleConnections()
	}
	for _, hc := range c.own {
		hc.CloseIdleConnections()
	}
}

// agentClient is the HTTP client a group of simulated agents shares. With
// HTTP/1.1 (plaintext) each session stream holds a connection of its own,
// as a real agent's does, and requests reuse a pool of idle connections.
// With http2, streams are multiplexed over a few connections (over TLS
// negotiated by ALPN, else plaintext HTTP/2 with prior knowledge), which is
// how more nodes fit under one process's open-file limit than it has
// descriptors for. With roots, the transport verifies every replica
// against exactly those CAs, with the host name, and keeps a session cache
// the agents of the process share (see sharedSessions).
func agentClient(r *router, http2 bool, roots []*x509.Certificate, obs *observer) *http.Client {
	tlsConfig := pki.ClientTLSConfig(roots)
	if tlsConfig != nil {
		tlsConfig.ClientSessionCache = sharedSessions{tlsConfig.ClientSessionCache}
	}
	tr := &http.Transport{
		DialContext:         r.dial,
		MaxIdleConns:        idleConns * len(r.addrs),
		MaxIdleConnsPerHost: idleConns,
		IdleConnTimeout:     5 * time.Minute,
		DisableCompression:  true,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	if http2 {
		tr.Protocols = new(http.Protocols)
		if roots != nil {
			tr.Protocols.SetHTTP2(true)
		} else {
			tr.Protocols.SetUnencryptedHTTP2(true)
		}
	}
	var base http.RoundTripper = tr
	if roots != nil {
		base = pki.Explaining(tr, roots)
	}
	return &http.Client{Transport: obs.around(base)}
}

// sharedSessions is the TLS session cache the agents of one process share.
// It keeps one ticket per replica name, which every agent dialling that
// name resumes with, as each real agent resumes with its own. What it does
// not do is forget a ticket when a handshake that used it fails (Go's
// client does so, RFC 5077 3.2): one real agent's timed-out handshake costs
// that agent its ticket, but here it would cost every agent of the process
// theirs at once, turning a reconnect storm of resumptions into one of
// full handshakes that no real fleet would see. A ticket the server cannot
// use is no failure: the server answers with a full handshake and the
// client stores the new ticket.
type sharedSessions struct{ tls.ClientSessionCache }

func (c sharedSessions) Put(key string, cs *tls.ClientSessionState) {
	if cs != nil {
		c.ClientSessionCache.Put(key, cs)
	}
}

// observer notes which replica each session stream was opened on, and
// when: that is what says a node is back in session after a replica died.
type observer struct {
	base   http.RoundTripper
	router *router
	sink   sink
	index  map[string]int // node ID → node index
	bad    *atomic.Int64  // 400 answers seen, by every observer of the process
}

// around is an observer of the same process's agents over base.
func (o *observer) around(base http.RoundTripper) *observer {
	return &observer{base: base, router: o.router, sink: o.sink, index: o.index, bad: o.bad}
}

func (o *observer) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path != nodeproto.PathSession {
		resp, err := o.base.RoundTrip(req)
		if err == nil && resp.StatusCode == http.StatusBadRequest && o.bad.Add(1) <= 5 {
			// A node call refused as malformed is a simulator or protocol
			// bug worth seeing whole.
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(body))
			fmt.Fprintf(os.Stderr, "fleetsim: %s %s answered 400: %q (headers %v)\n", req.Method, req.URL.Path, body, resp.Header)
		}
		return resp, err
	}
	replica := -1
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if k, ok := o.router.byAddr[info.Conn.RemoteAddr().String()]; ok {
			replica = k
		}
	}}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	resp, err := o.base.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusOK {
		if n, ok := o.index[req.Header.Get(nodeproto.HeaderNodeID)]; ok {
			o.sink.sessionOpened(n, replica, time.Now())
		}
	}
	return resp, err
}

// sink receives what the simulated agents observe: the recorder itself when
// the agents run in this process, a pipe to it when they run in a shard
// process. n is the node's index in the fleet. Implementations are safe for
// concurrent use.
type sink interface {
	enrolled(n int, at time.Time)
	sessionOpened(n, replica int, at time.Time)
	heartbeat(n int, at time.Time)
	heartbeatFailed(n int)
	// command is a command's arrival on the node's session stream; runID
	// is set for a launch.
	command(n int, op string, created time.Time, runID string, at time.Time)
	// eventsHeld counts events the control plane acknowledged holding.
	eventsHeld(n, count int)
	// running is the control plane's acknowledgement of the run's running
	// observation.
	running(n int, runID string, at time.Time)
	launched(n int, key nodeproto.WorkloadKey, at time.Time)
	agentStopped(n int, err error)
}

// simTransport is the agent's real HTTPTransport with the simulator's
// bookkeeping around it: enrollments, heartbeats, every command received
// (first delivery or redelivery) and the acknowledgement of each running
// observation.
type simTransport struct {
	inner *nodeagent.HTTPTransport
	sink  sink
	n     int
	// release, called once the node enrolled, lets the next agent start.
	release func()
}

func (t *simTransport) Enroll(ctx context.Context, r nodeproto.EnrollmentRequest) (nodeproto.Enrollment, error) {
	e, err := t.inner.Enroll(ctx, r)
	if err == nil {
		t.sink.enrolled(t.n, time.Now())
		t.release()
	}
	return e, err
}

func (t *simTransport) RenewSession(ctx context.Context, nodeID, tok string) (nodeproto.SessionRenewal, error) {
	return t.inner.RenewSession(ctx, nodeID, tok)
}

func (t *simTransport) Session(ctx context.Context, nodeID, tok string, commands chan<- nodeproto.Command) error {
	mid := make(chan nodeproto.Command)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case cmd := <-mid:
				runID := ""
				if l := cmd.LaunchWorkload; l != nil {
					runID = l.RunID
				}
				t.sink.command(t.n, cmd.OperationID, cmd.CreatedAt, runID, time.Now())
				select {
				case commands <- cmd:
				case <-ctx.Done():
					return
				}
			case <-stop:
				return
			}
		}
	}()
	err := t.inner.Session(ctx, nodeID, tok, mid)
	close(stop)
	<-done
	return err
}

func (t *simTransport) SendEvents(ctx context.Context, nodeID, tok string, events []nodeproto.Event) ([]string, error) {
	return t.SendEventsThrough(ctx, nodeID, tok, events, "")
}

// SendEventsThrough is nodeagent.ThroughSender: simulated agents declare
// their event watermark as real ones do, so the fleet measures its cost.
func (t *simTransport) SendEventsThrough(ctx context.Context, nodeID, tok string, events []nodeproto.Event, through string) ([]string, error) {
	accepted, err := t.inner.SendEventsThrough(ctx, nodeID, tok, events, through)
	now := time.Now()
	switch {
	case len(events) == 0 && err == nil:
		t.sink.heartbeat(t.n, now)
	case len(events) == 0:
		t.sink.heartbeatFailed(t.n)
	case err == nil:
		t.sink.eventsHeld(t.n, len(accepted))
		held := make(map[string]bool, len(accepted))
		for _, id := range accepted {
			held[id] = true
		}
		for _, ev := range events {
			if o := ev.Workload; o != nil && o.Phase == nodeproto.PhaseRunning && held[ev.ID] {
				t.sink.running(t.n, o.RunID, now)
			}
		}
	}
	return accepted, err
}

func (t *simTransport) SendLogs(ctx context.Context, nodeID, tok string, chunk nodeproto.LogChunk) (nodeproto.LogAck, error) {
	return t.inner.SendLogs(ctx, nodeID, tok, chunk)
}

// recorder is the simulator's bookkeeping, fed by every agent (through a
// sink) and the submitters. Per-node figures sit with their node, under its
// own lock, so ten thousand agents do not queue on one mutex.
type recorder struct {
	lease time.Duration
	// holdStart (Unix nanoseconds, 0 before the hold) is when heartbeats
	// start counting towards each node's sustained rate.
	holdStart atomic.Int64
	// stormAt (Unix nanoseconds, 0 before it) is when the reconnect storm
	// dropped every connection; reopened counts the nodes that opened a
	// session after it.
	stormAt  atomic.Int64
	reopened atomic.Int64
	nodes    []*nodeRec // by index, fixed before the agents start
	byID     map[string]int

	enrolledN       atomic.Int64
	sessionsOpen    atomic.Int64 // nodes whose session has opened at least once
	heartbeats      atomic.Int64
	heartbeatErrors atomic.Int64
	events          atomic.Int64
	commands        atomic.Int64 // first deliveries
	redeliveries    atomic.Int64
	heartbeatLapses atomic.Int64 // gaps between successful heartbeats longer than the lease
	stopped         atomic.Int64
	launches        *Launches

	mu       sync.Mutex
	delivery []time.Duration // first delivery − creation, per command
	created  []time.Time     // each command's creation, beside delivery
	runs     map[string]*runRec
	runningN int
	lastEnr  time.Time
	stops    []string
}

type nodeRec struct {
	id string

	mu             sync.Mutex
	enrolledAt     time.Time
	sessionAt      time.Time
	sessionReplica int
	lastHeartbeat  time.Time
	maxGap         time.Duration
	// The node's heartbeats during the hold: how many, the first and the
	// last.
	holdBeats           int
	holdFirst, holdLast time.Time
	ops                 map[string]int
}

type runRec struct {
	submitted time.Time // when the submission was sent
	received  time.Time // when its launch reached the node
	running   time.Time // when the control plane acknowledged the running observation
}

func newRecorder(lease time.Duration, ids []string) *recorder {
	r := &recorder{lease: lease, byID: map[string]int{}, runs: map[string]*runRec{}, launches: NewLaunches()}
	for i, id := range ids {
		r.nodes = append(r.nodes, &nodeRec{id: id, sessionReplica: -1})
		r.byID[id] = i
	}
	return r
}

func (r *recorder) run(id string) *runRec {
	rr, ok := r.runs[id]
	if !ok {
		rr = &runRec{}
		r.runs[id] = rr
	}
	return rr
}

func (r *recorder) enrolled(n int, at time.Time) {
	nr := r.nodes[n]
	nr.mu.Lock()
	first := nr.enrolledAt.IsZero()
	if first {
		nr.enrolledAt = at
	}
	nr.mu.Unlock()
	if !first {
		return
	}
	r.enrolledN.Add(1)
	r.mu.Lock()
	if at.After(r.lastEnr) {
		r.lastEnr = at
	}
	r.mu.Unlock()
}

func (r *recorder) sessionOpened(n, replica int, at time.Time) {
	nr := r.nodes[n]
	storm := r.stormAt.Load()
	nr.mu.Lock()
	first := nr.sessionAt.IsZero()
	again := storm != 0 && !first && nr.sessionAt.UnixNano() <= storm && at.UnixNano() > storm
	nr.sessionAt, nr.sessionReplica = at, replica
	nr.mu.Unlock()
	if first {
		r.sessionsOpen.Add(1)
	}
	if again {
		r.reopened.Add(1)
	}
}

func (r *recorder) heartbeat(n int, at time.Time) {
	r.heartbeats.Add(1)
	nr := r.nodes[n]
	nr.mu.Lock()
	if !nr.lastHeartbeat.IsZero() {
		gap := at.Sub(nr.lastHeartbeat)
		nr.maxGap = max(nr.maxGap, gap)
		if gap > r.lease {
			r.heartbeatLapses.Add(1)
		}
	}
	nr.lastHeartbeat = at
	if hs := r.holdStart.Load(); hs != 0 && at.UnixNano() >= hs {
		if nr.holdBeats == 0 {
			nr.holdFirst = at
		}
		nr.holdBeats++
		nr.holdLast = at
	}
	nr.mu.Unlock()
}

// maxHeartbeatGap is the longest time so far between two successful
// heartbeats of one node, as its agent saw them. The report reads it with
// the count of gaps over the lease, at the hold's end: read later, it
// took in gaps while the report itself loaded the machine (listing 50,000
// nodes), which the count did not, and the two disagreed.
func (r *recorder) maxHeartbeatGap() time.Duration {
	var out time.Duration
	for _, n := range r.nodes {
		n.mu.Lock()
		out = max(out, n.maxGap)
		n.mu.Unlock()
	}
	return out
}

// heartbeatRate is the fleet's sustained heartbeat rate during the hold:
// the sum over nodes of each node's rate between its first and last
// heartbeat in the hold. Counting heartbeats in a window instead would
// depend on where the window cuts the fleet's heartbeat phases (nodes that
// enrolled together beat together).
func (r *recorder) heartbeatRate() float64 {
	total := 0.0
	for _, nr := range r.nodes {
		nr.mu.Lock()
		if nr.holdBeats >= 2 {
			total += float64(nr.holdBeats-1) / nr.holdLast.Sub(nr.holdFirst).Seconds()
		}
		nr.mu.Unlock()
	}
	return total
}

func (r *recorder) heartbeatFailed(n int) { r.heartbeatErrors.Add(1) }

func (r *recorder) command(n int, op string, created time.Time, runID string, at time.Time) {
	nr := r.nodes[n]
	nr.mu.Lock()
	if nr.ops == nil {
		nr.ops = map[string]int{}
	}
	nr.ops[op]++
	again := nr.ops[op] > 1
	nr.mu.Unlock()
	if again {
		r.redeliveries.Add(1)
		return
	}
	r.commands.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !created.IsZero() {
		r.delivery = append(r.delivery, at.Sub(created))
		r.created = append(r.created, created)
	}
	if runID != "" {
		rr := r.run(runID)
		if rr.received.IsZero() {
			rr.received = at
		}
	}
}

// deliveriesCreated is the delivery times, sorted, of the commands created
// in [from, to].
func (r *recorder) deliveriesCreated(from, to time.Time) []time.Duration {
	r.mu.Lock()
	var out []time.Duration
	for i, c := range r.created {
		if !c.Before(from) && !c.After(to) {
			out = append(out, r.delivery[i])
		}
	}
	r.mu.Unlock()
	sortDurations(out)
	return out
}

func (r *recorder) eventsHeld(n, count int) { r.events.Add(int64(count)) }

func (r *recorder) running(n int, runID string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rr := r.run(runID)
	if rr.running.IsZero() {
		rr.running = at
		r.runningN++
	}
}

func (r *recorder) launched(n int, key nodeproto.WorkloadKey, at time.Time) {
	r.launches.launched(key, at)
}

func (r *recorder) agentStopped(n int, err error) {
	r.stopped.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.stops) < 5 {
		r.stops = append(r.stops, fmt.Sprintf("%s: %v", r.nodes[n].id, err))
	}
}

func (r *recorder) submitted(id string, at time.Time) {
	r.mu.Lock()
	r.run(id).submitted = at
	r.mu.Unlock()
}

func (r *recorder) runningCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runningN
}
