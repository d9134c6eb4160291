// Package faultproxy is a TCP proxy on loopback that a test puts between a
// node agent and the control plane, so it can break their connection on
// purpose while work is in flight and then check what survived.
//
// It models the ways a real network fails a long-lived, outbound-only agent:
//
//   - Cut closes every connection and refuses new ones (each is accepted and
//     reset at once) until Restore: a cable pulled, a firewall rule, a peer
//     that restarted. Both ends notice promptly.
//   - Blackhole accepts and holds everything but forwards nothing until
//     Restore: a stalled route. Data already read from a connection waits and
//     is forwarded after Restore, the way TCP would retransmit it;
//     connections opened during the blackhole never reach the upstream (their
//     SYN "was lost") and are closed at Restore.
//   - FreezeExisting (or FreezeConn, for one) silences the connections open
//     now, forever, without a FIN or a reset, while new connections flow
//     normally: the half-dead connection a NAT or a crashed middlebox leaves
//     behind, which only an application-level timeout can detect.
//   - SetDelay adds latency to every chunk in both directions.
//
// A Tap sees every chunk before it is forwarded and may have the connection
// closed instead of (or right after) forwarding it; a test uses that to
// parse the protocol on the wire and to cut a session stream right after a
// command went down it.
//
// The proxy only ever listens on 127.0.0.1. Importers: tests only (the
// fault-injection suite in e2e/fault); nothing in a production path.
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Direction says which way a chunk travels.
type Direction int

const (
	// ClientToServer is from the connecting side (the agent) to the upstream.
	ClientToServer Direction = iota
	// ServerToClient is from the upstream back to the connecting side.
	ServerToClient
)

func (d Direction) String() string {
	if d == ClientToServer {
		return "client→server"
	}
	return "server→client"
}

// Verdict is what a Tap wants done with a chunk.
type Verdict int

const (
	// Forward forwards the chunk.
	Forward Verdict = iota
	// ForwardThenClose forwards the chunk and then closes the connection
	// (both sides).
	ForwardThenClose
	// Close drops the chunk and closes the connection (both sides): the
	// receiving side never sees it.
	Close
)

// Tap observes the traffic. Data is called from the connection's forwarding
// goroutine with each chunk read, in order per direction, before it is
// forwarded; p is only valid during the call. Data must be quick: forwarding
// waits for it. Closed is called once when a connection has been closed,
// after the last Data for it. Calls for different connections and
// directions are concurrent.
type Tap interface {
	Data(conn uint64, dir Direction, p []byte) Verdict
	Closed(conn uint64)
}

// Stats counts what the proxy did since Start.
type Stats struct {
	Accepted  int64 // connections accepted and forwarded (or held)
	Refused   int64 // connections reset while cut
	Closed    int64 // connections closed by Cut, CloseConn or a Tap verdict
	Frozen    int64 // connections silenced by FreezeExisting
	BytesUp   int64 // client→server bytes forwarded
	BytesDown int64 // server→client bytes forwarded
}

// Proxy forwards TCP connections from its loopback address to an upstream
// address. All methods are safe for concurrent use.
type Proxy struct {
	l   net.Listener
	tap Tap

	mu        sync.Mutex
	upstream  string
	cut       bool
	blackhole bool
	gate      chan struct{} // closed while traffic may flow; replaced by Blackhole
	delay     time.Duration
	conns     map[uint64]*conn
	nextID    uint64
	closed    bool

	wg    sync.WaitGroup
	stats struct{ accepted, refused, closed, frozen, up, down atomic.Int64 }
}

type conn struct {
	id       uint64
	client   net.Conn
	upstream net.Conn // nil until dialled
	frozen   atomic.Bool
	heldOnly bool // accepted during a blackhole; never dialled (immutable)
	once     sync.Once
	done     chan struct{}
}

// Option configures a Proxy.
type Option func(*Proxy)

// WithTap installs a Tap.
func WithTap(t Tap) Option { return func(p *Proxy) { p.tap = t } }

// Start listens on 127.0.0.1 on a free port and forwards every connection to
// upstream ("host:port"). Close stops it.
func Start(upstream string, options ...Option) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{l: l, upstream: upstream, conns: map[uint64]*conn{}, gate: make(chan struct{})}
	close(p.gate)
	for _, o := range options {
		o(p)
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address, "127.0.0.1:PORT".
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// SetUpstream changes where new connections go; open ones stay where they are.
func (p *Proxy) SetUpstream(addr string) {
	p.mu.Lock()
	p.upstream = addr
	p.mu.Unlock()
}

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	victims := p.allLocked()
	p.mu.Unlock()
	for _, c := range victims {
		p.closeConn(c, true)
	}
}

// Blackhole stops all forwarding until Restore, without closing anything
// (see the package doc for what happens to data and connections meanwhile).
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.blackhole {
		p.blackhole = true
		p.gate = make(chan struct{})
	}
}

// FreezeExisting silences every connection open now: nothing more is
// forwarded on them in either direction and nothing tells either end. They
// end when an end closes them, or at Cut or Close. New connections are not
// affected. It returns how many connections it froze.
func (p *Proxy) FreezeExisting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.conns {
		if !c.frozen.Swap(true) {
			n++
		}
	}
	p.stats.frozen.Add(int64(n))
	return n
}

// FreezeConn silences one open connection the way FreezeExisting silences
// all of them: the idle keep-alive connection whose NAT mapping expired,
// say. It reports whether the connection was open.
func (p *Proxy) FreezeConn(id uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.conns[id]
	if c == nil {
		return false
	}
	if !c.frozen.Swap(true) {
		p.stats.frozen.Add(1)
	}
	return true
}

// Restore ends a Cut or a Blackhole: new connections are forwarded again,
// data held by a blackhole flows, and connections accepted during the
// blackhole are closed (they never reached the upstream). Frozen
// connections stay frozen.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	var held []*conn
	if p.blackhole {
		p.blackhole = false
		for _, c := range p.conns {
			if c.heldOnly {
				held = append(held, c)
			}
		}
		close(p.gate)
	}
	p.mu.Unlock()
	for _, c := range held {
		p.closeConn(c, true)
	}
}

// SetDelay makes every chunk wait d before it is forwarded (0 for none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// CloseConn closes one connection (both sides). It reports whether the
// connection was still open.
func (p *Proxy) CloseConn(id uint64) bool {
	p.mu.Lock()
	c := p.conns[id]
	p.mu.Unlock()
	if c == nil {
		return false
	}
	p.closeConn(c, true)
	return true
}

// Conns is how many connections are open now.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted: p.stats.accepted.Load(), Refused: p.stats.refused.Load(), Closed: p.stats.closed.Load(),
		Frozen: p.stats.frozen.Load(), BytesUp: p.stats.up.Load(), BytesDown: p.stats.down.Load(),
	}
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	victims := p.allLocked()
	if p.blackhole {
		p.blackhole = false
		close(p.gate)
	}
	p.mu.Unlock()
	err := p.l.Close()
	for _, c := range victims {
		p.closeConn(c, false)
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) allLocked() []*conn {
	out := make([]*conn, 0, len(p.conns))
	for _, c := range p.conns {
		out = append(out, c)
	}
	return out
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		nc, err := p.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		if p.closed || p.cut {
			p.mu.Unlock()
			p.stats.refused.Add(1)
			reset(nc)
			continue
		}
		p.nextID++
		c := &conn{id: p.nextID, client: nc, done: make(chan struct{}), heldOnly: p.blackhole}
		p.conns[c.id] = c
		p.mu.Unlock()
		p.stats.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(c)
	}
}

// reset closes a connection with an RST rather than a FIN, which is how a
// refused connection looks to the dialler.
func reset(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	nc.Close()
}

func (p *Proxy) serve(c *conn) {
	defer p.wg.Done()
	if p.tap != nil {
		// After the pumps ended, so after the last Data call.
		defer p.tap.Closed(c.id)
	}
	if c.heldOnly {
		// Accepted during a blackhole: it never reaches the upstream, and
		// Restore, Cut or Close ends it.
		<-c.done
		return
	}
	p.mu.Lock()
	addr := p.upstream
	p.mu.Unlock()
	up, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		p.closeConn(c, false)
		return
	}
	p.mu.Lock()
	if _, open := p.conns[c.id]; !open {
		p.mu.Unlock()
		up.Close()
		return
	}
	c.upstream = up
	p.mu.Unlock()
	defer p.closeConn(c, false)
	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() { defer pumps.Done(); p.pump(c, ClientToServer, c.client, up) }()
	go func() { defer pumps.Done(); p.pump(c, ServerToClient, up, c.client) }()
	pumps.Wait()
}

// pump copies one direction. It ends at the first read or write error, or
// when the connection is closed, and then closes the connection: a proxy
// that half-closed would keep sessions alive that either end gave up on.
// A frozen connection's data is read and discarded, so neither end is
// blocked and neither learns anything.
func (p *Proxy) pump(c *conn, dir Direction, from, to net.Conn) {
	defer p.closeConn(c, false)
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && !c.frozen.Load() {
			if !p.wait(c) {
				return
			}
			if c.frozen.Load() {
				continue
			}
			verdict := Forward
			if p.tap != nil {
				verdict = p.tap.Data(c.id, dir, buf[:n])
			}
			if verdict == Close {
				p.closeConn(c, true)
				return
			}
			if dir == ClientToServer {
				p.stats.up.Add(int64(n))
			} else {
				p.stats.down.Add(int64(n))
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
			if verdict == ForwardThenClose {
				p.closeConn(c, true)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// wait holds a chunk while the proxy is blackholed and applies the delay. It
// returns false when the connection was closed meanwhile.
func (p *Proxy) wait(c *conn) bool {
	p.mu.Lock()
	gate, delay := p.gate, p.delay
	p.mu.Unlock()
	select {
	case <-gate:
	case <-c.done:
		return false
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.done:
			return false
		}
	}
	return true
}

// closeConn closes both sides once; byFault says the proxy closed it on
// purpose (Cut, CloseConn, a Tap verdict), which Stats counts.
func (p *Proxy) closeConn(c *conn, byFault bool) {
	c.once.Do(func() {
		p.mu.Lock()
		delete(p.conns, c.id)
		up := c.upstream
		p.mu.Unlock()
		close(c.done)
		c.client.Close()
		if up != nil {
			up.Close()
		}
		if byFault {
			p.stats.closed.Add(1)
		}
	})
}
