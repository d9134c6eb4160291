// Package callconn is the HTTP/1.1 client of one function container: one
// connection to its FDK's listener, kept between calls, with each call's
// request written and its response read in the caller's own goroutine.
// Only package fnagent uses it.
//
// Why not net/http's Transport, which it replaced: the Transport hands
// every request to a writer goroutine and every response to a reader
// goroutine of the connection, two wake-ups between threads a call. Over a
// unix socket those cost as much of the client's CPU as the rest of the
// round trip (75 µs against 37 µs a call, the same requests and server,
// measured when this package was written), and on a node whose calls are
// CPU-bound that is throughput. A container serves one call at a time, so
// its connection never carries two requests at once and needs neither
// goroutine.
//
// What the Transport did that the engine relies on, this keeps:
//
//   - One connection, reused only after a response read to its end without
//     error, with the call's context still live and neither side asking to
//     close. Anything else (an error, the context ending, a body closed
//     early, a request body the container did not read whole) closes it,
//     so nothing a broken call leaves on the connection is read as the next
//     call's response.
//   - A call's context ending interrupts its reads and writes at once, the
//     response body's included.
//   - A connection idle for Config.Idle or longer is not used again (see
//     Config.Idle), and CloseIdle closes an idle one now.
//   - A reused connection the container closed while it was idle fails the
//     write of the next request before a byte of it is delivered; that
//     request is sent again on a fresh connection, once, when its body can
//     be replayed. A request the container may have read is never sent
//     twice: a function runs a call once.
//   - Response headers are bounded (Config.MaxHeaderBytes), and
//     informational responses (1xx but 101) are skipped.
//   - A request body that is not in memory, or is large, is written by a
//     goroutine of its own while the response is read, so a container that
//     answers before reading it all is heard.
package callconn

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Config is a Client's.
type Config struct {
	// Dial opens a connection to the container's listener.
	Dial func(ctx context.Context) (net.Conn, error)
	// Idle is how long an idle connection may be used again: a call after a
	// longer pause dials anew. An FDK's server closing an idle connection
	// just as a call is sent on it would fail that call, so Idle must stay
	// under the keep-alive timeouts of the HTTP servers FDKs use. The
	// connection itself is closed by CloseIdle (before a pause) or at the
	// next call.
	Idle time.Duration
	// MaxHeaderBytes bounds a response's status line and headers.
	MaxHeaderBytes int64
}

// inlineBody is the largest in-memory request body written in the
// caller's goroutine before the response is read: well under a unix
// socket's send buffer, so the write never waits on the container.
const inlineBody = 64 << 10

// Client is one container's connection. Its methods are safe for
// concurrent use; calls are served one at a time, in turn.
type Client struct {
	cfg Config
	// turn is held by the call in flight, from RoundTrip until its
	// response body ends or is closed.
	turn chan struct{}

	mu     sync.Mutex
	idle   *conn // between calls; nil when none is kept
	closed bool
}

// New makes a Client; it dials nothing until the first call.
func New(cfg Config) *Client {
	return &Client{cfg: cfg, turn: make(chan struct{}, 1)}
}

// conn is one connection and its buffers.
type conn struct {
	nc      net.Conn
	r       budgetReader
	br      *bufio.Reader
	bw      *bufio.Writer
	written int64 // bytes the connection took, all calls
	since   time.Time
}

func (c *conn) Write(p []byte) (int, error) {
	n, err := c.nc.Write(p)
	c.written += int64(n)
	return n, err
}

// budgetReader reads the connection, failing once more than left bytes
// were read while limited (a response's head).
type budgetReader struct {
	nc      net.Conn
	limited bool
	left    int64
}

var errHeaderTooBig = errors.New("response headers too big")

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.limited {
		if b.left <= 0 {
			return 0, errHeaderTooBig
		}
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
	}
	n, err := b.nc.Read(p)
	if b.limited {
		b.left -= int64(n)
	}
	return n, err
}

// RoundTrip sends req on the container's connection and reads its
// response's head. The response's body must be read to its end or closed:
// until then the connection is the call's, and the next call waits. On an
// error the connection is closed and the turn given back.
func (cl *Client) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	select {
	case cl.turn <- struct{}{}:
	case <-ctx.Done():
		closeBody(req)
		return nil, ctx.Err()
	}
	c, reused, err := cl.take(ctx)
	if err != nil {
		<-cl.turn
		closeBody(req)
		return nil, err
	}
	resp, err := cl.send(ctx, c, req)
	if err != nil && reused && c.written == 0 && replayable(req) {
		// Closed by the container while idle: nothing of this request
		// reached it.
		resp, err = cl.resend(ctx, req)
	}
	if err != nil {
		<-cl.turn
	}
	return resp, err
}

// resend sends req again on a new connection.
func (cl *Client) resend(ctx context.Context, req *http.Request) (*http.Response, error) {
	if req.GetBody != nil {
		b, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		req.Body = b
	}
	c, err := cl.dial(ctx)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	return cl.send(ctx, c, req)
}

// replayable reports whether req's body can be sent again.
func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// take is the idle connection if it may be used, or a new one.
func (cl *Client) take(ctx context.Context) (c *conn, reused bool, err error) {
	cl.mu.Lock()
	c, cl.idle = cl.idle, nil
	closed := cl.closed
	cl.mu.Unlock()
	if closed {
		return nil, false, net.ErrClosed
	}
	if c != nil {
		if time.Since(c.since) < cl.cfg.Idle {
			c.written = 0
			return c, true, nil
		}
		c.nc.Close()
	}
	c, err = cl.dial(ctx)
	return c, false, err
}

func (cl *Client) dial(ctx context.Context) (*conn, error) {
	nc, err := cl.cfg.Dial(ctx)
	if err != nil {
		return nil, err
	}
	c := &conn{nc: nc}
	c.r.nc = nc
	c.br = bufio.NewReader(&c.r)
	c.bw = bufio.NewWriter(c)
	return c, nil
}

// aLongTimeAgo is a deadline that fails every read and write at once.
var aLongTimeAgo = time.Unix(1, 0)

// send writes req on c and reads the response's head. On an error c is
// closed; the turn stays the caller's to give back or to retry with.
func (cl *Client) send(ctx context.Context, c *conn, req *http.Request) (*http.Response, error) {
	// A context that ends interrupts whatever the call is doing on c.
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(aLongTimeAgo) })
	fail := func(err error) (*http.Response, error) {
		stop()
		c.nc.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, err
	}
	var wrote chan error
	inline := req.ContentLength <= inlineBody && replayable(req)
	if inline {
		if err := write(c, req); err != nil {
			return fail(err)
		}
	} else {
		wrote = make(chan error, 1)
		src := &bodyErr{ReadCloser: req.Body}
		if req.Body != nil {
			req.Body = src
		}
		go func() {
			err := write(c, req)
			if src.err != nil {
				err = src.err // the body's own failure, not the connection's
			}
			if err != nil {
				// The response may never come while the container waits
				// for the rest of the body.
				c.nc.SetDeadline(aLongTimeAgo)
			}
			wrote <- err
		}()
	}
	resp, err := readHead(c, req, cl.cfg.MaxHeaderBytes)
	if err != nil {
		if wrote != nil {
			select {
			case werr := <-wrote:
				if werr != nil {
					err = werr // the cause: the container stopped reading
				}
			default:
				c.nc.SetDeadline(aLongTimeAgo)
				<-wrote
			}
		}
		return fail(err)
	}
	resp.Body = &body{r: resp.Body, cl: cl, c: c, stop: stop, wrote: wrote,
		keep: !resp.Close && !req.Close}
	return resp, nil
}

// write sends req's head and body and flushes them.
func write(c *conn, req *http.Request) error {
	if err := req.Write(c.bw); err != nil {
		return err
	}
	return c.bw.Flush()
}

// bodyErr remembers a request body's read error, which Request.Write
// returns wrapped in a type of its own.
type bodyErr struct {
	io.ReadCloser
	err error
}

func (b *bodyErr) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// readHead reads the response to req, past any informational ones.
func readHead(c *conn, req *http.Request, max int64) (*http.Response, error) {
	c.r.limited, c.r.left = true, max
	defer func() { c.r.limited = false }()
	for {
		resp, err := http.ReadResponse(c.br, req)
		if errors.Is(err, errHeaderTooBig) {
			return nil, fmt.Errorf("the response's headers exceed %d bytes", max)
		}
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			c.r.left = max
			continue
		}
		return resp, nil
	}
}

// body is a response's body; its end gives the connection back.
type body struct {
	r     io.ReadCloser
	cl    *Client
	c     *conn
	stop  func() bool
	wrote chan error // the body's writer, when it had one
	keep  bool
	once  sync.Once
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil {
		b.finish(err == io.EOF)
	}
	return n, err
}

// Close ends the call; before the body's end it drops the connection.
func (b *body) Close() error {
	b.finish(false)
	return nil
}

// finish gives the turn back, and the connection to the idle slot when
// the call ended cleanly (clean: the body read to its end).
func (b *body) finish(clean bool) {
	b.once.Do(func() {
		keep := clean && b.keep && b.stop() // stop is false once the context ended
		if b.wrote != nil {
			select {
			case err := <-b.wrote:
				keep = keep && err == nil
			default:
				// Answered before its request was read whole: the rest
				// of the request is still on its way.
				keep = false
				b.c.nc.Close()
				<-b.wrote
			}
		}
		if keep {
			b.c.since = time.Now()
			b.cl.mu.Lock()
			if b.cl.closed {
				keep = false
			} else {
				b.cl.idle = b.c
			}
			b.cl.mu.Unlock()
		}
		if !keep {
			b.stop()
			b.c.nc.Close()
		}
		<-b.cl.turn
	})
}

// CloseIdle closes the connection kept between calls, if any; a call in
// flight keeps its own.
func (cl *Client) CloseIdle() {
	cl.mu.Lock()
	c := cl.idle
	cl.idle = nil
	cl.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
}

// Close closes the idle connection and refuses later calls; a call in
// flight ends on its own.
func (cl *Client) Close() {
	cl.mu.Lock()
	cl.closed = true
	cl.mu.Unlock()
	cl.CloseIdle()
}
