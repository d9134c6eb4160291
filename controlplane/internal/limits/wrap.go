package limits

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
)

// Class is how a route is limited; routes.go gives every route's.
type Class struct {
	// Name labels the class in errors and docs.
	Name string
	// Body is the largest request body accepted, in bytes; Unbounded leaves
	// the size to the handler (it streams the body, or refuses it in its
	// own API's shape).
	Body int64
	// Stream: a long-lived answer (a session stream, a log follow, a wait,
	// an invocation, a download). Counted against the stream caps; its
	// write deadline is per write, and its read deadline is cleared once
	// its body was read.
	Stream bool
	// Upload: the body is read under a deadline per read (progress) rather
	// than one for the whole request, and the answer is written under a
	// deadline per write. Counted as an ordinary request.
	Upload bool
	// PerCaller, when positive, is this class's own cap per caller in
	// place of the Options' (a node's session streams: SessionsPerNode).
	PerCaller int
	// NodeBulk: a node's event or log post, limited per node
	// (MaxNodeBulkPerNode) and counted against NodeBodyBudget.
	NodeBulk bool
}

// Unbounded is Class.Body for a route whose handler bounds its own body.
const Unbounded = -1

// API is the default class: an ordinary call with a JSON body of at most
// httpapi.MaxBody.
var API = Class{Name: "api", Body: httpapi.MaxBody}

// Limiter applies Options to handlers (Wrap). Safe for concurrent use.
type Limiter struct {
	opts Options
	obs  Observer

	requests, streams, bulk counter
	nodeBytes               budget
}

// Observer is told what the limiter does (the server's metrics). Either
// function may be nil.
type Observer struct {
	// Refused is called with the reason of every refusal: "caller",
	// "overall", "node_bytes", "too_large".
	Refused func(reason string)
	// InFlight is called with +1 and -1 as requests ("requests") and
	// streams ("streams") start and end.
	InFlight func(kind string, delta float64)
}

// New returns a limiter with o (defaults applied) that tells obs what it
// does.
func New(o Options, obs Observer) *Limiter {
	if obs.Refused == nil {
		obs.Refused = func(string) {}
	}
	if obs.InFlight == nil {
		obs.InFlight = func(string, float64) {}
	}
	o = o.Defaults()
	return &Limiter{opts: o, obs: obs, nodeBytes: budget{max: o.NodeBodyBudget}}
}

// Options is the limiter's options, defaults applied.
func (l *Limiter) Options() Options { return l.opts }

// Wrap serves h under class c, counting the request against the caller
// key(r) names: a credential's name, "node:ID", or "addr:IP" for a
// caller without a credential (Caller). key is called when the request
// arrives, so it must come after whatever authenticated the caller.
func (l *Limiter) Wrap(c Class, key func(*http.Request) string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.Body >= 0 && r.ContentLength > c.Body {
			l.obs.Refused("too_large")
			if r.ProtoMajor == 1 {
				w.Header().Set("Connection", "close") // the unread body is not worth reading
			}
			httpapi.WriteError(w, failure.Invalid("", "request body is larger than %d bytes (it declares %d); this route (%s) accepts at most %d", c.Body, r.ContentLength, c.Name, c.Body))
			return
		}
		who := key(r)
		release, reason := l.acquire(c, who, r)
		if reason != "" {
			l.refuse(w, reason, c, who)
			return
		}
		defer release()
		if c.Body >= 0 && r.Body != nil && r.Body != http.NoBody {
			r.Body = http.MaxBytesReader(w, r.Body, c.Body)
		}
		if !c.Stream && !c.Upload {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{}) // each write sets its own (streamWriter)
		sw := &streamWriter{ResponseWriter: w, rc: rc, timeout: l.opts.WriteTimeout}
		switch {
		case r.Body == nil || r.Body == http.NoBody:
			_ = rc.SetReadDeadline(time.Time{}) // nothing to read: only the server's watch of the connection
		case c.Upload:
			r.Body = &bodyDeadline{ReadCloser: r.Body, rc: rc, progress: l.opts.ReadTimeout}
		default:
			r.Body = &bodyDeadline{ReadCloser: r.Body, rc: rc}
		}
		h.ServeHTTP(sw, r)
		// What the server writes after the handler (the end of a chunked
		// answer, the buffer's rest) gets a deadline of its own: the last
		// write's may have passed while a log follow waited for its run.
		_ = rc.SetWriteDeadline(time.Now().Add(l.opts.WriteTimeout))
	})
}

// acquire counts the request in; reason is why it may not go on.
func (l *Limiter) acquire(c Class, who string, r *http.Request) (release func(), reason string) {
	counter, max, perCaller := &l.requests, l.opts.MaxInFlight, l.opts.MaxInFlightPerCaller
	if c.Stream {
		counter, max, perCaller = &l.streams, l.opts.MaxStreams, l.opts.MaxStreamsPerCaller
	}
	if c.PerCaller > 0 {
		perCaller = c.PerCaller
	}
	if reason = counter.acquire(who, max, perCaller); reason != "" {
		return nil, reason
	}
	kind := "requests"
	if c.Stream {
		kind = "streams"
	}
	l.obs.InFlight(kind, 1)
	counted := func() { counter.release(who); l.obs.InFlight(kind, -1) }
	if !c.NodeBulk {
		return counted, ""
	}
	if reason = l.bulk.acquire(who, -1, l.opts.MaxNodeBulkPerNode); reason != "" {
		counted()
		return nil, reason
	}
	weight := r.ContentLength
	if weight < 0 || weight > c.Body {
		weight = c.Body
	}
	weight *= NodeBodyCost
	if !l.nodeBytes.acquire(weight) {
		l.bulk.release(who)
		counted()
		return nil, "node_bytes"
	}
	return func() { l.nodeBytes.release(weight); l.bulk.release(who); counted() }, ""
}

// refuse answers 429 (the caller's share) or 503 (the server's), with
// Retry-After, in the API's error shape with the code "unavailable", which
// clients (and agents) treat as worth retrying.
func (l *Limiter) refuse(w http.ResponseWriter, reason string, c Class, who string) {
	l.obs.Refused(reason)
	status, msg := http.StatusServiceUnavailable, "the control plane is serving as many requests as it is configured to; retry after the time in Retry-After"
	switch {
	case reason == "caller":
		status = http.StatusTooManyRequests
		msg = fmt.Sprintf("too many requests in flight for %s (class %s); retry after the time in Retry-After", who, c.Name)
	case reason == "node_bytes":
		msg = "too many node bodies are being read at once; retry after the time in Retry-After"
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(l.opts.RetryAfter.Seconds()))))
	httpapi.WriteJSON(w, status, api.Error{Error: api.ErrorBody{Code: failure.Code(failure.ErrUnavailable), Message: msg}})
}

// counter counts requests in flight overall and per caller.
type counter struct {
	mu    sync.Mutex
	total int
	byWho map[string]int
}

// acquire counts one in, or says why not: "caller" past perCaller,
// "overall" past max (negative: no cap).
func (c *counter) acquire(who string, max, perCaller int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if perCaller >= 0 && c.byWho[who] >= perCaller {
		return "caller" // first: when both are full, it is this caller's doing
	}
	if max >= 0 && c.total >= max {
		return "overall"
	}
	if c.byWho == nil {
		c.byWho = map[string]int{}
	}
	c.total++
	c.byWho[who]++
	return ""
}

func (c *counter) release(who string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total--
	if c.byWho[who]--; c.byWho[who] <= 0 {
		delete(c.byWho, who) // a caller gone leaves nothing behind
	}
}

// budget is a count of bytes that may not go past max.
type budget struct {
	mu        sync.Mutex
	used, max int64
}

func (b *budget) acquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.max >= 0 && b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}

func (b *budget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// streamWriter sets the write deadline before every write and flush: a
// stream may last as long as it has something to say, but a client that
// stops reading it is cut off after the timeout.
type streamWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (s *streamWriter) Write(p []byte) (int, error) {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	return s.ResponseWriter.Write(p)
}

// Flush implements http.Flusher (the session stream asks for it).
func (s *streamWriter) Flush() {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	_ = s.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (s *streamWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// bodyDeadline reads a body under a read deadline of progress (for an
// upload: each read must bring something within it) and clears the read
// deadline once the body ended, so that the server's watch of the
// connection, which starts then, does not time out and cancel a stream
// that is still answering.
type bodyDeadline struct {
	io.ReadCloser
	rc       *http.ResponseController
	progress time.Duration // zero: the request's own deadline applies
}

func (b *bodyDeadline) Read(p []byte) (int, error) {
	if b.progress > 0 {
		_ = b.rc.SetReadDeadline(time.Now().Add(b.progress))
	}
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
