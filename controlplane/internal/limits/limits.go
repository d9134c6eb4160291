// Package limits bounds what HTTP clients can make the control plane hold:
// connections, requests in flight (overall and per caller), request
// bodies, node bodies in memory, and how long a connection may take to
// send a request, to read an answer, or sit idle. Without it, 200 clients
// sending one byte every few seconds held 200 goroutines for as long as
// they liked, and 40 node event posts of 7.6 MB took the process from 48
// MiB to a gigabyte.
//
// A route belongs to a Class (the table in this package's routes.go, by
// ServeMux pattern): ordinary API calls, long-lived streams (session
// streams, log follows, waits, invocations, downloads), uploads, and node
// bulk posts (events, logs). Limiter.Wrap applies the class to a handler:
//
//   - A body larger than the class allows is refused before it is read,
//     when its length is declared, and cut off at the limit otherwise.
//   - Requests in flight are counted overall and per caller (a credential's
//     name, a node's ID, or for a caller without a credential its remote
//     address); streams are counted apart from ordinary requests, since ten
//     thousand nodes hold ten thousand session streams. Over a caller's
//     share the answer is 429, over the server's 503, both with
//     Retry-After, at once rather than after a queue.
//   - Node bulk posts are also limited per node, and their bodies share one
//     budget of bytes in flight across all nodes, which is what bounds the
//     memory node bodies can take.
//   - Deadlines: ordinary requests live under the server's ReadTimeout and
//     WriteTimeout (net/http's, whole-request). Streams and uploads cannot:
//     their write deadline is set before every write instead (a client that
//     stops reading is cut after WriteTimeout), an upload's read deadline
//     before every read of its body (a client that stops sending is cut
//     after ReadTimeout), and once a body has been read the read deadline
//     is cleared so the server's watch of the connection does not end a
//     long stream's context.
//
// Listener caps connections. Only package controlplane may import it.
package limits

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/nodeproto"
)

// Options are the server's limits. Zero values take the defaults named on
// each field (Defaults); a negative count means no limit.
type Options struct {
	// ReadHeaderTimeout bounds reading a request's headers (default 10s).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading an ordinary request, headers and body
	// (default 60s), and for uploads the longest wait for the next piece
	// of the body.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing an ordinary response (default 60s), and
	// for streams and uploads each single write.
	WriteTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its next
	// request (default 120s; agents report every 10s, so theirs stay open).
	IdleTimeout time.Duration
	// MaxConns caps open connections (default 65,536: ten thousand nodes
	// hold two or three each over HTTP/1.1). Over it, a new connection is
	// closed at once.
	MaxConns int
	// MaxInFlight caps ordinary requests being served (default 8,192);
	// MaxInFlightPerCaller a single caller's (default 256: the fleet
	// simulator enrolls 200 agents at once from one address).
	MaxInFlight, MaxInFlightPerCaller int
	// MaxStreams caps streams held (default 65,536: a session stream per
	// node for fifty thousand nodes, and room for log follows, waits and
	// invocations; at 32,768 a 50,000-node fleet simulation stopped with
	// exactly that many nodes in session); MaxStreamsPerCaller a single
	// caller's (default 1,024).
	// A node holds at most SessionsPerNode session streams.
	MaxStreams, MaxStreamsPerCaller int
	// MaxNodeBulkPerNode caps one node's event and log posts in flight
	// (default 4: an agent sends heartbeats, its spool and its containers'
	// output, each one at a time).
	MaxNodeBulkPerNode int
	// NodeBodyBudget caps the memory node event and log bodies in flight
	// may take across all nodes (default 64 MiB). A body is counted at
	// NodeBodyCost times its declared length, or its route's limit when it
	// declares none; at least one body of the largest size must fit.
	NodeBodyBudget int64
	// RetryAfter is what 429 and 503 answers ask the client to wait
	// (default 1s; whole seconds on the wire).
	RetryAfter time.Duration
}

// NodeBodyCost is what a node body costs in memory per byte while it is
// handled: the JSON decoder's buffer (with the garbage of its growth), the
// decoded values and the store's encoding of them each hold about a copy.
// The resource-exhaustion suite (daemon/bounded_flood_test.go) measured a
// heap peak 65–76 MiB above the start for four event batches of 3.9 MiB
// handled at once: 4.2–4.9 bytes per byte.
const NodeBodyCost = 4

// SessionsPerNode caps one node's session streams held at once: one is
// current; a reconnecting agent's new stream may overlap an old one the
// server has not noticed is dead yet.
const SessionsPerNode = 8

// Defaults returns o with every zero field set to its default.
func (o Options) Defaults() Options {
	set := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	setN := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	set(&o.ReadHeaderTimeout, 10*time.Second)
	set(&o.ReadTimeout, 60*time.Second)
	set(&o.WriteTimeout, 60*time.Second)
	set(&o.IdleTimeout, 120*time.Second)
	set(&o.RetryAfter, time.Second)
	setN(&o.MaxConns, 65536)
	setN(&o.MaxInFlight, 8192)
	setN(&o.MaxInFlightPerCaller, 256)
	setN(&o.MaxStreams, 65536)
	setN(&o.MaxStreamsPerCaller, 1024)
	setN(&o.MaxNodeBulkPerNode, 4)
	if o.NodeBodyBudget == 0 {
		o.NodeBodyBudget = 64 << 20
	}
	return o
}

// Check says what is wrong with o (defaults applied), naming the `mercator
// server` flag to fix: a timeout that is not positive, a node body budget
// too small for one event batch of the largest size a node may send (a node
// could never deliver one).
func (o Options) Check() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"read-header-timeout", o.ReadHeaderTimeout}, {"read-timeout", o.ReadTimeout}, {"write-timeout", o.WriteTimeout}, {"idle-timeout", o.IdleTimeout}, {"retry-after", o.RetryAfter}} {
		if d.v < 0 {
			return fmt.Errorf("--%s is %v; it must be positive, such as 30s", d.flag, d.v)
		}
	}
	if least := int64(NodeBodyCost * nodeproto.MaxEventBody); o.NodeBodyBudget >= 0 && o.NodeBodyBudget < least {
		return fmt.Errorf("--node-body-budget is %s; it must be at least %s (%d times the largest event batch a node may send, %s)", bytesize.Format(o.NodeBodyBudget), bytesize.Format(least), NodeBodyCost, bytesize.Format(nodeproto.MaxEventBody))
	}
	return nil
}

// Server applies the timeouts, and the bound on HTTP/2 header tables
// (HeaderTableSize), to srv.
func (o Options) Server(srv *http.Server) {
	srv.ReadHeaderTimeout = o.ReadHeaderTimeout
	srv.ReadTimeout = o.ReadTimeout
	srv.WriteTimeout = o.WriteTimeout
	srv.IdleTimeout = o.IdleTimeout
	if srv.HTTP2 == nil {
		srv.HTTP2 = &http.HTTP2Config{}
	}
	srv.HTTP2.MaxDecoderHeaderTableSize = HeaderTableSize
	srv.HTTP2.MaxEncoderHeaderTableSize = HeaderTableSize
}

// HeaderTableSize bounds each HTTP/2 connection's two header compression
// tables (HPACK's dynamic tables, the protocol's default 4 KiB each). Every
// agent holds a connection open, and at 10,000 nodes the tables were the
// largest part of a replica's live heap (77 MB); a kilobyte still holds what
// a connection repeats on every request (the credential, the content type,
// the agent's own headers).
const HeaderTableSize = 1024

// Listener returns l with at most max connections open (none when max is
// negative): a connection over the cap is closed as soon as it is accepted,
// and refused is called. A client then sees its connection reset and
// retries; waiting in the kernel's backlog instead would look the same
// to it, only later.
func Listener(l net.Listener, max int, refused func()) net.Listener {
	if max < 0 {
		return l
	}
	return &limitListener{Listener: l, slots: make(chan struct{}, max), refused: refused}
}

type limitListener struct {
	net.Listener
	slots   chan struct{}
	refused func()
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			c.Close()
			if l.refused != nil {
				l.refused()
			}
		}
	}
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// CloseWrite half-closes the connection when the one under it can (a
// TCP connection; a hijacked call answers stream ends so).
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
