package function

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/callkind"
	"github.com/mercator/mercator/controlplane/internal/fnheader"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/scheduler"
)

// Calls through the fleet.
//
// The control plane places each call on a node (scheduler.PlaceFunction) and
// reaches the node over its own session stream, which the agent opened:
// the invoke command carries the call's ID, the function's configuration
// and the address of this replica, and the agent answers with requests of
// its own to the calls paths (nodeproto.PathCalls). Here those requests
// meet the caller's at a rendezvous, an in-memory record keyed by an ID
// minted per attempt, and the bodies are piped between them without being
// held whole: the agent reads the caller's body as the function reads it,
// and the function's response reaches the caller chunk by chunk.
//
// A node that answers busy before it has read any of the body is passed
// over for the next node in the function's order; the last node tried
// queues the call instead (bounded by the call's deadline and the node's
// slot wait). Synchronous calls are never stored, so a call lives as long
// as its caller's request and a replica's restart loses the calls it was
// relaying (their callers see the connection drop). A node lost during a
// call (its session ended, or its response broke off) ends the call with
// an error; nothing waits past the call's deadline.
//
// With several replicas the node's session may be held by another one.
// The command then travels as a signal through the Coordinator, as a
// reference only (signals must stay small), and the agent fetches the rest
// from this replica; if no agent fetches it within pickupTimeout the node
// is passed over.

const (
	// InlineBody is the largest request body sent inside the invoke
	// command, which saves the agent a round trip for the common small
	// call.
	InlineBody = 64 << 10
	// maxTries bounds how many nodes one call is offered to.
	maxTries = 4
	// AnswerGrace is how long past the call's deadline the control plane
	// waits for the node's answer (the node enforces the deadline itself;
	// this covers the trip back).
	AnswerGrace = 2 * time.Second
	// pickupTimeout bounds the wait for an agent to fetch a command that
	// crossed replicas.
	pickupTimeout = 3 * time.Second
	// cacheTTL is how long a function's record and the node list are
	// reused before they are read again. Another replica's change to a
	// function takes effect here within it; this replica's own changes at
	// once.
	cacheTTL = time.Second
	// logWait bounds the wait for a durable call's log after its response.
	logWait = 5 * time.Second
)

// topicInvoke carries an invoke command reference to the replica holding
// the node's session.
const topicInvoke = "invoke:"

type publishedInvoke struct {
	NodeID string                  `json:"node_id"`
	Cmd    nodeproto.InvokeCommand `json:"cmd"`
}

func (s *Service) publish(nodeID string, ref nodeproto.InvokeCommand) error {
	raw, err := json.Marshal(publishedInvoke{NodeID: nodeID, Cmd: ref})
	if err != nil {
		return err
	}
	return s.pub.Publish(context.Background(), topicInvoke+string(raw))
}

// deliverPublished hands a command another replica published to the
// node's session, if this replica holds it.
func (s *Service) deliverPublished(topic string) {
	if s == nil {
		return
	}
	var p publishedInvoke
	if err := json.Unmarshal([]byte(strings.TrimPrefix(topic, topicInvoke)), &p); err != nil {
		return
	}
	s.host.Send(p.NodeID, nodeproto.Command{Kind: nodeproto.KindInvoke, Invoke: &p.Cmd})
}

// Dispatch.

// callSink is where a call's response goes: the caller's ResponseWriter,
// or a buffer for a durable call.
type callSink interface {
	Header() http.Header
	WriteHeader(status int)
	Write(p []byte) (int, error)
	Flush() error
}

// writerSink adapts the caller's ResponseWriter.
type writerSink struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (s writerSink) Header() http.Header         { return s.w.Header() }
func (s writerSink) WriteHeader(status int)      { s.w.WriteHeader(status) }
func (s writerSink) Write(p []byte) (int, error) { return s.w.Write(p) }
func (s writerSink) Flush() error                { return s.rc.Flush() }

// fnCall is one call to place.
type fnCall struct {
	entry  *fnEntry
	id     string
	header http.Header
	// data is the whole body when it is held (a small body, or a durable
	// call's): every attempt can send it again. Otherwise stream is the
	// body, which only the first node to read it gets.
	data     []byte
	stream   io.Reader
	length   int64
	deadline time.Time
	logs     bool
	sink     callSink
}

// callOutcome is how a call ended.
type callOutcome struct {
	kind, message string // kind "" is success
	nodeID        string
	tries         int
	started       bool // the response began
	status        int
	log           string
	retryable     bool // nothing ran and the body is untouched: another node may take it
}

// dispatch offers the call to its candidate nodes in order until one
// takes it.
func (s *Service) dispatch(ctx context.Context, c *fnCall) callOutcome {
	nodes, fitting, err := s.candidates(ctx, c.entry)
	if err != nil {
		return callOutcome{kind: callkind.Unavailable, message: err.Error(), retryable: true}
	}
	if len(nodes) == 0 {
		msg := fmt.Sprintf("no ready node can hold the function (it needs %v)", c.entry.need)
		if pools := c.entry.need.Pools; len(pools) > 0 {
			msg = fmt.Sprintf("no ready node in project %s's pools (%s) can hold the function (it needs %v)",
				api.ProjectOf(c.entry.app.Project), strings.Join(pools, ", "), c.entry.need)
		}
		if fitting > 0 {
			msg = fmt.Sprintf("%d nodes can hold the function (it needs %v) but none is connected to this control plane", fitting, c.entry.need)
		}
		return callOutcome{kind: callkind.NoCapacity, message: msg, retryable: true}
	}
	tries := c.entry.tries(len(nodes))
	var out callOutcome
	for i := 0; i < tries; i++ {
		out = s.attempt(ctx, c, nodes[i], c.entry.specFor(i, tries), i == tries-1)
		out.tries = i + 1
		if !out.retryable || ctx.Err() != nil || !s.now().Before(c.deadline) {
			break
		}
		if i < tries-1 {
			s.metrics.spills.WithLabelValues(c.entry.fn.ID).Inc()
		}
	}
	return out
}

// attempt offers the call to one node and relays its answer.
func (s *Service) attempt(ctx context.Context, c *fnCall, n scheduler.FunctionNode, spec nodeproto.FunctionSpec, last bool) callOutcome {
	remaining := c.deadline.Sub(s.now())
	if remaining <= 0 {
		return callOutcome{kind: callkind.Timeout, message: "the call's deadline passed before a node took it", nodeID: n.ID}
	}
	cmd := nodeproto.InvokeCommand{
		CallID: c.id, Rendezvous: httpapi.NewID("rv-"), URL: s.replicaURL(), Function: &spec,
		Header: c.header, ContentLength: c.length, Timeout: remaining, NoWait: !last, Logs: c.logs,
		AnswerStream: true, // answers.go
	}
	rv := &rendezvous{id: cmd.Rendezvous, nodeID: n.ID, answered: make(chan struct{}), logs: make(chan string, 1)}
	switch {
	case c.data != nil && len(c.data) <= InlineBody:
		cmd.Body, cmd.BodyInline, cmd.ContentLength = c.data, true, int64(len(c.data))
	case c.data != nil:
		rv.body = bytes.NewReader(c.data)
	default:
		rv.body = c.stream
	}
	rv.cmd = cmd
	s.rvs.Store(rv.id, rv)
	defer s.rvs.Delete(rv.id)

	var pickup <-chan time.Time
	var sessionDone <-chan struct{}
	lost, held, sent := s.host.Send(n.ID, nodeproto.Command{Kind: nodeproto.KindInvoke, Invoke: &cmd})
	if held {
		if !sent {
			return callOutcome{kind: callkind.Busy, message: "the node's session is backed up", nodeID: n.ID, retryable: true}
		}
		sessionDone = lost
		route := "session"
		if rv.via != nil {
			route = "answers_stream"
		}
		s.metrics.invokes.WithLabelValues(route).Inc()
	} else if s.pub != nil {
		s.metrics.invokes.WithLabelValues("replica").Inc()
		if err := s.publish(n.ID, nodeproto.InvokeCommand{CallID: cmd.CallID, Rendezvous: cmd.Rendezvous, URL: cmd.URL,
			ContentLength: cmd.ContentLength, Timeout: cmd.Timeout, NoWait: cmd.NoWait, Logs: cmd.Logs}); err != nil {
			return callOutcome{kind: callkind.Unreachable, message: "publish to the node's replica: " + err.Error(), nodeID: n.ID, retryable: true}
		}
		t := time.NewTimer(pickupTimeout)
		defer t.Stop()
		pickup = t.C
	} else {
		return callOutcome{kind: callkind.Unreachable, message: "the node is not connected", nodeID: n.ID, retryable: true}
	}

	timer := time.NewTimer(remaining + AnswerGrace)
	defer timer.Stop()
	via := rv.via
	out := func() callOutcome {
		for {
			select {
			case <-rv.answered:
				return s.relay(c, rv)
			case <-via:
				var lost <-chan struct{}
				if lost, via = s.resend(n.ID, &cmd, rv, via); lost != nil {
					sessionDone = lost
				}
			case <-sessionDone:
				if rv.abandon() {
					return callOutcome{kind: callkind.NodeLost, message: "the node's session ended before it answered"}
				}
				return s.relay(c, rv)
			case <-pickup:
				pickup = nil
				if !rv.fetched.Load() && rv.abandon() {
					return callOutcome{kind: callkind.Unreachable, message: "no agent took the command within " + pickupTimeout.String(), retryable: true}
				}
			case <-ctx.Done():
				if rv.abandon() {
					if errors.Is(ctx.Err(), context.DeadlineExceeded) {
						return callOutcome{kind: callkind.Timeout, message: "the call's deadline passed"}
					}
					return callOutcome{kind: callkind.Canceled, message: "the caller went away"}
				}
				return s.relay(c, rv)
			case <-timer.C:
				if rv.abandon() {
					return callOutcome{kind: callkind.Timeout, message: "the node did not answer by the call's deadline"}
				}
				return s.relay(c, rv)
			}
		}
	}()
	out.nodeID = n.ID
	if out.kind == callkind.Busy || out.kind == callkind.Refused {
		out.retryable = !rv.taken.Load()
	}
	if c.logs && out.started {
		select {
		case out.log = <-rv.logs:
		case <-time.After(logWait):
		case <-ctx.Done():
		}
	}
	return out
}

// resend sends cmd again after the call answers stream it went down
// (broke) broke before an answer came: down the session, or a stream
// opened since, whose break next is then to be watched in turn (nil when
// none). The agent runs a rendezvous once. lost is the session's end, nil
// when the command could not be sent (the wait goes on as it was).
func (s *Service) resend(nodeID string, cmd *nodeproto.InvokeCommand, rv *rendezvous, broke <-chan struct{}) (lost, next <-chan struct{}) {
	s.metrics.invokes.WithLabelValues("resent").Inc()
	lost, held, sent := s.host.Send(nodeID, nodeproto.Command{Kind: nodeproto.KindInvoke, Invoke: cmd})
	if !held || !sent {
		return nil, nil
	}
	if rv.via != broke {
		next = rv.via
	}
	return lost, next
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// relay handles the node's answer: an error as it is, a response by
// copying it to the call's sink as it arrives.
func (s *Service) relay(c *fnCall, rv *rendezvous) callOutcome {
	a := rv.ans
	if a.kind != "" {
		return callOutcome{kind: a.kind, message: a.message}
	}
	out := callOutcome{started: true, status: a.status}
	h := c.sink.Header()
	for k, vs := range a.header {
		h[k] = vs
	}
	h.Set("Fn-Call-Id", c.id)
	// A response the node sent whole goes to the caller with its length,
	// in one write; one the node streams is flushed chunk by chunk.
	whole := a.length >= 0
	if whole {
		h.Set("Content-Length", strconv.FormatInt(a.length, 10))
	}
	c.sink.WriteHeader(a.status)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var done error
	for {
		n, rerr := a.body.Read(buf)
		if n > 0 {
			if _, werr := c.sink.Write(buf[:n]); werr != nil {
				out.kind, out.message, done = callkind.Canceled, "writing to the caller: "+werr.Error(), werr
				break
			}
			if !whole {
				_ = c.sink.Flush()
			}
		}
		if rerr == io.EOF {
			if kind := a.trailer().Get(nodeproto.HeaderCallError); kind != "" {
				out.kind, out.message = kind, a.trailer().Get(nodeproto.HeaderCallMessage)
			}
			break
		}
		if rerr != nil {
			out.kind, out.message, done = callkind.NodeLost, "the node's response broke off: "+rerr.Error(), rerr
			break
		}
	}
	a.done <- done
	return out
}

// Invoke.

func (s *Service) fnInvoke(w http.ResponseWriter, r *http.Request) {
	e, err := s.lookupInvoked(r)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	if strings.EqualFold(r.Header.Get("Fn-Invoke-Type"), "detached") {
		s.enqueue(w, r, e, fnheader.Invoke(r))
		return
	}
	s.invokeSync(w, r, e, fnheader.Invoke(r))
}

// lookupInvoked is the function /invoke/{fn_id} names, refused to an
// invoker key of another app, and to a caller without a credential unless
// the app is public (httpapi.ConfineToApp, public.go).
func (s *Service) lookupInvoked(r *http.Request) (*fnEntry, error) {
	e, err := s.lookupFn(r.Context(), r.PathValue("fn_id"))
	if err != nil {
		return nil, err
	}
	if err := httpapi.ConfineToApp(r.Context(), e.app.Name, appPublic(e.app.Annotations), "invoke functions"); err != nil {
		return nil, err
	}
	return e, nil
}

// fnInvokeAsync (Mercator) is the detached invoke at a path of its own.
func (s *Service) fnInvokeAsync(w http.ResponseWriter, r *http.Request) {
	e, err := s.lookupInvoked(r)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.enqueue(w, r, e, fnheader.Invoke(r))
}

// fnTrigger serves /t/{app_name}/{source...}: the app's HTTP trigger of
// that source (Fn's "/" for an empty one).
func (s *Service) fnTrigger(w http.ResponseWriter, r *http.Request) {
	source := "/" + r.PathValue("source")
	e, public, err := s.lookupTrigger(r.Context(), r.PathValue("app_name"), source)
	if err == nil {
		// An invoker key calls its own app's triggers only; a caller
		// without a credential, public triggers only.
		err = httpapi.ConfineToApp(r.Context(), e.app.Name, public, "call triggers")
	}
	if err != nil {
		s.fnFail(w, err)
		return
	}
	if strings.EqualFold(r.Header.Get("Fn-Invoke-Type"), "detached") {
		s.enqueue(w, r, e, fnheader.Trigger(r))
		return
	}
	s.invokeSync(w, r, e, fnheader.Trigger(r))
}

// callerDeadline is the call's deadline: the function's timeout from the
// call's arrival, or the caller's own Fn-Deadline (RFC 3339) when that is
// sooner. It travels to the node as the time left, and the container sees
// it as Fn-Deadline.
func callerDeadline(r *http.Request, limit time.Time) time.Time {
	if v := r.Header.Get("Fn-Deadline"); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil && t.Before(limit) {
			return t
		}
	}
	return limit
}

// invokeSync runs a call for the caller of r and streams the answer back.
func (s *Service) invokeSync(w http.ResponseWriter, r *http.Request, e *fnEntry, header http.Header) {
	start := s.now()
	callID := httpapi.NewID("call-")
	if r.ContentLength > api.FnMaxRequestBytes {
		w.Header().Set("Fn-Call-Id", callID)
		writeFnJSON(w, http.StatusRequestEntityTooLarge, api.FnError{Message: "Request content too large", Kind: "request_too_big",
			Detail: fmt.Sprintf("the body is %d bytes; a function accepts %d", r.ContentLength, api.FnMaxRequestBytes)})
		s.metrics.observe(e.fn.ID, "request_too_big", 0)
		return
	}
	rc := http.NewResponseController(w)
	// The function may answer while it still reads the request (a stream
	// in, a stream out), so the caller's body must stay readable after the
	// response began.
	_ = rc.EnableFullDuplex()
	c := &fnCall{entry: e, id: callID, header: header, length: r.ContentLength,
		deadline: callerDeadline(r, start.Add(e.spec.Timeout)), sink: writerSink{w: w, rc: rc}}
	// A small body is read now and travels inside the command; a larger
	// one is streamed to the node as the function reads it.
	if r.Body != nil && r.Body != http.NoBody {
		prefix, err := io.ReadAll(io.LimitReader(r.Body, InlineBody+1))
		if err != nil {
			writeFnError(w, http.StatusBadRequest, "Invalid payload")
			return
		}
		if len(prefix) <= InlineBody {
			c.data, c.length = prefix, int64(len(prefix))
		} else {
			c.stream = io.MultiReader(bytes.NewReader(prefix), r.Body)
		}
	} else {
		c.data, c.length = []byte{}, 0
	}
	ctx, cancel := context.WithDeadline(r.Context(), c.deadline.Add(AnswerGrace))
	defer cancel()
	out := s.dispatch(ctx, c)
	s.metrics.observe(e.fn.ID, out.kind, s.now().Sub(start))
	if out.kind == "" {
		return
	}
	if out.started {
		// The status line is gone; the one honest thing left is to cut
		// the response off so the caller does not take it for whole.
		s.log.Warn("function call broke off after its response began", "fn", e.fn.ID, "call", callID, "node", out.nodeID, "kind", out.kind, "err", out.message)
		panic(http.ErrAbortHandler)
	}
	if out.kind == callkind.Canceled && r.Context().Err() != nil {
		return
	}
	status, msg := callkind.Status(out.kind)
	w.Header().Set("Fn-Call-Id", callID)
	writeFnJSON(w, status, api.FnError{Message: msg, Kind: out.kind, Detail: out.message})
}
