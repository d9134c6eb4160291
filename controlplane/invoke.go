package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/node"
	"github.com/mercator/mercator/store"
)

// Calls through the fleet.
//
// The control plane places each call on a node (functions_place.go) and
// reaches the node over its own session stream, which the agent opened:
// the invoke command carries the call's ID, the function's configuration
// and the address of this replica, and the agent answers with requests of
// its own to the calls paths (capability.PathCalls). Here those requests
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
	// inlineBody is the largest request body sent inside the invoke
	// command, which saves the agent a round trip for the common small
	// call.
	inlineBody = 64 << 10
	// maxTries bounds how many nodes one call is offered to.
	maxTries = 4
	// answerGrace is how long past the call's deadline the control plane
	// waits for the node's answer (the node enforces the deadline itself;
	// this covers the trip back).
	answerGrace = 2 * time.Second
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

// Kinds a call can end with beyond fnagent's (api.FnError.Kind).
const (
	kindBusy        = "busy"
	kindNoCapacity  = "no_capacity"
	kindNodeLost    = "node_lost"
	kindUnreachable = "unreachable"
	kindRefused     = "refused"
	kindTimeout     = "timeout"
	kindCanceled    = "canceled"
	kindUnavailable = "unavailable"
)

// fnState is the Functions machinery a replica keeps in memory: the
// sessions it holds, the rendezvous of the calls it is relaying, caches,
// and metrics. Nothing in it is authoritative; the store is.
type fnState struct {
	s   *Server
	log *slog.Logger

	mu       sync.Mutex
	sessions map[string]*liveSession // by node ID, the latest only

	rvs sync.Map // rendezvous ID → *rendezvous

	logAsks sync.Map // call_log request ID → *logAsk (functions_logs.go)

	fns      sync.Map // fn ID → *fnEntry
	triggers sync.Map // app name NUL source → *triggerEntry

	nodesMu sync.Mutex
	nodes   atomic.Pointer[fnNodeList]

	metrics   *fnMetrics
	wakeAsync chan struct{}
}

func newFunctions(s *Server) *fnState {
	fs := &fnState{s: s, log: s.log, sessions: map[string]*liveSession{}, wakeAsync: make(chan struct{}, 1)}
	fs.metrics = newFnMetrics(s)
	return fs
}

// replicaURL is where this replica's agents-facing calls paths are.
func (fs *fnState) replicaURL() string {
	if fs.s.cfg.ReplicaURL != "" {
		return strings.TrimRight(fs.s.cfg.ReplicaURL, "/")
	}
	return fs.s.publicBase()
}

// Sessions.

// liveSession is a node's session stream held by this replica, to which
// invoke commands are handed directly, without the store.
type liveSession struct {
	nodeID  string
	fencing uint64
	// cmds holds pointers: a slot per queued call costs a word, not a
	// command (a thousand slots of node.Command were 60 KB a session, the
	// largest part of a replica's memory at ten thousand nodes).
	cmds chan *node.Command
	done chan struct{}
}

// commands is the channel the session loop forwards; nil (never ready)
// for a nil session.
func (ls *liveSession) commands() <-chan *node.Command {
	if ls == nil {
		return nil
	}
	return ls.cmds
}

// attachSession registers a session stream that is about to start. It
// reads the session request's (empty) body to its end first: only then
// does the HTTP server watch the connection and cancel the request's
// context the moment the agent goes away, rather than when the next
// keep-alive fails to write, and a call in flight on a dead node must
// fail promptly.
func (fs *fnState) attachSession(nodeID string, fencing uint64, r *http.Request) *liveSession {
	if fs == nil {
		return nil
	}
	io.Copy(io.Discard, io.LimitReader(r.Body, httpapi.MaxBody))
	ls := &liveSession{nodeID: nodeID, fencing: fencing, cmds: make(chan *node.Command, 1024), done: make(chan struct{})}
	fs.mu.Lock()
	fs.sessions[nodeID] = ls
	fs.mu.Unlock()
	fs.nodes.Store(nil) // read the fleet again: a node is back
	return ls
}

// detachSession unregisters a session whose stream ended; calls sent on
// it and not answered yet end as node_lost.
func (fs *fnState) detachSession(ls *liveSession) {
	if fs == nil || ls == nil {
		return
	}
	fs.mu.Lock()
	if fs.sessions[ls.nodeID] == ls {
		delete(fs.sessions, ls.nodeID)
	}
	fs.mu.Unlock()
	close(ls.done)
}

func (fs *fnState) session(nodeID string) *liveSession {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.sessions[nodeID]
}

// forward writes cmd to the session stream, with every other command
// already queued, and flushes once.
func (fs *fnState) forward(enc *json.Encoder, f http.Flusher, ls *liveSession, cmd *node.Command) error {
	for {
		if err := enc.Encode(cmd); err != nil {
			return err
		}
		select {
		case cmd = <-ls.cmds:
		default:
			f.Flush()
			return nil
		}
	}
}

// send hands cmd to the node's session on this replica; false when this
// replica holds none or it is overloaded.
func (fs *fnState) send(ls *liveSession, cmd capability.InvokeCommand) bool {
	select {
	case ls.cmds <- &node.Command{Kind: node.KindInvoke, FencingToken: ls.fencing, Invoke: &cmd}:
		return true
	default:
		return false
	}
}

// topicInvoke carries an invoke command reference to the replica holding
// the node's session.
const topicInvoke = "invoke:"

type publishedInvoke struct {
	NodeID string                   `json:"node_id"`
	Cmd    capability.InvokeCommand `json:"cmd"`
}

func (fs *fnState) publish(nodeID string, ref capability.InvokeCommand) error {
	raw, err := json.Marshal(publishedInvoke{NodeID: nodeID, Cmd: ref})
	if err != nil {
		return err
	}
	return fs.s.coord.Publish(context.Background(), topicInvoke+string(raw))
}

// deliverPublished hands a command another replica published to the
// node's session, if this replica holds it.
func (fs *fnState) deliverPublished(topic string) {
	if fs == nil {
		return
	}
	var p publishedInvoke
	if err := json.Unmarshal([]byte(strings.TrimPrefix(topic, topicInvoke)), &p); err != nil {
		return
	}
	if ls := fs.session(p.NodeID); ls != nil {
		fs.send(ls, p.Cmd)
	}
}

// Caches.

// fnEntry is a function as the invoke path needs it.
type fnEntry struct {
	fn   store.Fn
	app  store.App
	spec capability.FunctionSpec
	need fnNeed
	at   time.Time
}

// newFnEntry is f's entry, with config the containers' environment
// (Server.functionEnv, which opens the secrets).
func newFnEntry(f store.Fn, app store.App, config map[string]string, at time.Time) *fnEntry {
	spec := capability.FunctionSpec{
		ID: f.ID, AppID: f.AppID, Name: f.Name, AppName: app.Name, Image: f.PinnedImage,
		MemoryMB: int64(f.Memory), MilliCPUs: int64(math.Round(f.CPU * 1000)), GPUs: f.GPUs, Config: config,
		Timeout: time.Duration(f.Timeout) * time.Second, IdleTimeout: time.Duration(f.IdleTimeout) * time.Second,
		MaxConcurrency: f.MaxConcurrency,
	}
	if spec.MemoryMB == 0 {
		spec.MemoryMB = api.FnDefaultMemoryMB
	}
	if spec.Timeout == 0 {
		spec.Timeout = api.FnDefaultTimeout * time.Second
	}
	return &fnEntry{fn: f, app: app, spec: spec, at: at,
		need: fnNeed{MemoryBytes: spec.MemoryMB << 20, MilliCPUs: spec.MilliCPUs, GPUs: f.GPUs, GPUModel: f.GPUModel}}
}

// lookupFn returns the function and its app, from the cache when fresh.
func (fs *fnState) lookupFn(ctx context.Context, id string) (*fnEntry, error) {
	now := fs.s.now()
	if v, ok := fs.fns.Load(id); ok {
		if e := v.(*fnEntry); now.Sub(e.at) < cacheTTL {
			return e, nil
		}
	}
	var e *fnEntry
	err := fs.s.store.View(ctx, func(tx store.Tx) error {
		f, err := tx.GetFn(id)
		if err != nil {
			return notFoundAs(err, errFnNotFound)
		}
		app, err := tx.GetApp(f.AppID)
		if err != nil {
			return notFoundAs(err, errFnAppNotFound)
		}
		env, err := fs.s.functionEnv(app, f) // secrets.go
		if err != nil {
			return err
		}
		e = newFnEntry(f, app, env, now)
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The pull credential for the function's registry, when one is stored
	// (registries.go); it travels with each command, never stored on the
	// node, as a Run's does.
	e.spec.RegistryAuth = fs.s.registryAuth(ctx, e.spec.Image)
	fs.fns.Store(id, e)
	return e, nil
}

type triggerEntry struct {
	appID, fnID string
	at          time.Time
}

// lookupTrigger finds the function an HTTP trigger of the app names.
func (fs *fnState) lookupTrigger(ctx context.Context, appName, source string) (*fnEntry, error) {
	key := appName + "\x00" + source
	now := fs.s.now()
	if v, ok := fs.triggers.Load(key); ok {
		if t := v.(*triggerEntry); now.Sub(t.at) < cacheTTL {
			return fs.lookupFn(ctx, t.fnID)
		}
	}
	var t triggerEntry
	err := fs.s.store.View(ctx, func(tx store.Tx) error {
		app, err := tx.GetAppByName(appName)
		if err != nil {
			return notFoundAs(err, errFnAppNotFound)
		}
		tr, err := tx.GetTriggerBySource(app.ID, "http", source)
		if err != nil {
			return notFoundAs(err, errTriggerNotFound)
		}
		t = triggerEntry{appID: app.ID, fnID: tr.FnID, at: now}
		return nil
	})
	if err != nil {
		return nil, err
	}
	fs.triggers.Store(key, &t)
	return fs.lookupFn(ctx, t.fnID)
}

// forgetFn and forgetApp drop cached entries this replica just changed.
func (fs *fnState) forgetFn(id string) {
	if fs == nil {
		return
	}
	fs.fns.Delete(id)
	fs.triggers.Range(func(k, v any) bool {
		if v.(*triggerEntry).fnID == id {
			fs.triggers.Delete(k)
		}
		return true
	})
}

func (fs *fnState) forgetApp(id string) {
	if fs == nil {
		return
	}
	fs.fns.Range(func(k, v any) bool {
		if v.(*fnEntry).app.ID == id {
			fs.fns.Delete(k)
		}
		return true
	})
	fs.triggers.Range(func(k, v any) bool {
		if v.(*triggerEntry).appID == id {
			fs.triggers.Delete(k)
		}
		return true
	})
}

type fnNodeList struct {
	at    time.Time
	nodes []fnNode
}

// fleet is the nodes that take calls, read at most every cacheTTL.
func (fs *fnState) fleet(ctx context.Context) ([]fnNode, error) {
	now := fs.s.now()
	if l := fs.nodes.Load(); l != nil && now.Sub(l.at) < cacheTTL {
		return l.nodes, nil
	}
	fs.nodesMu.Lock()
	defer fs.nodesMu.Unlock()
	if l := fs.nodes.Load(); l != nil && now.Sub(l.at) < cacheTTL {
		return l.nodes, nil
	}
	var nodes []fnNode
	err := fs.s.store.View(ctx, func(tx store.Tx) error {
		all, err := tx.ListNodes()
		if err != nil {
			return err
		}
		for _, n := range all {
			if fn, ok := fnNodeOf(n, fs.s.nodeStatus(n) == api.NodeReady); ok {
				nodes = append(nodes, fn)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	fs.nodes.Store(&fnNodeList{at: now, nodes: nodes})
	return nodes, nil
}

// candidates are the nodes to offer the call to, in order. With one
// replica, a node whose session this replica does not hold cannot be
// reached and is left out.
func (fs *fnState) candidates(ctx context.Context, e *fnEntry) (order []fnNode, fitting int, err error) {
	nodes, err := fs.fleet(ctx)
	if err != nil {
		return nil, 0, err
	}
	order = placeFn(e.fn.ID, nodes, e.need)
	fitting = len(order)
	if fs.s.coord == nil {
		reachable := order[:0:0]
		for _, n := range order {
			if fs.session(n.ID) != nil {
				reachable = append(reachable, n)
			}
		}
		order = reachable
	}
	return order, fitting, nil
}

// functionNodeRoutes adds the calls paths of the node protocol.
func (s *Server) functionNodeRoutes(mux *http.ServeMux) {
	mux.Handle("GET "+capability.PathCalls+"{id}", s.nodeAuth(s.callCommand))
	mux.Handle("GET "+capability.PathCalls+"{id}/request", s.nodeAuth(s.callRequestBody))
	mux.Handle("POST "+capability.PathCalls+"{id}/response", s.nodeAuth(s.callResponse))
	mux.Handle("POST "+capability.PathCalls+"{id}/log", s.nodeAuth(s.callLog))
}

// Rendezvous.

// rendezvous is one attempt of one call on one node.
type rendezvous struct {
	id     string
	nodeID string
	cmd    capability.InvokeCommand // the whole command
	body   io.Reader                // what GET …/request streams; nil when inline or empty

	taken   atomic.Bool // the agent began reading the body
	fetched atomic.Bool // the agent fetched the command

	session *liveSession // nil when the command was published

	mu       sync.Mutex
	state    int // rvWaiting, rvAnswered, rvAbandoned
	ans      *callAnswer
	answered chan struct{}
	logs     chan string
}

const (
	rvWaiting = iota
	rvAnswered
	rvAbandoned
)

// callAnswer is the node's answer: an error before any response (kind),
// or a response whose body is being posted.
type callAnswer struct {
	kind, message string

	status int
	header http.Header
	// length is the body's length when the node sent it whole, else -1.
	length  int64
	body    io.Reader
	trailer func() http.Header
	// done is sent, exactly once, when the caller's side finished with
	// body: nil when it read it all, the error otherwise.
	done chan error
}

// deliver records the first answer; false if the attempt already has one
// or was abandoned.
func (rv *rendezvous) deliver(a *callAnswer) bool {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if rv.state != rvWaiting {
		return false
	}
	rv.state, rv.ans = rvAnswered, a
	close(rv.answered)
	return true
}

// abandon gives the attempt up; false when an answer arrived first, which
// the caller must then handle (a streamed answer waits for its done).
func (rv *rendezvous) abandon() bool {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if rv.state == rvAnswered {
		return false
	}
	rv.state = rvAbandoned
	return true
}

// lookupRendezvous finds a rendezvous for the calling node.
func (fs *fnState) lookupRendezvous(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) *rendezvous {
	v, ok := fs.rvs.Load(r.PathValue("id"))
	if !ok {
		httpapi.WriteJSON(w, http.StatusGone, api.ErrorOf(failure.NotFound("call attempt", r.PathValue("id"))))
		return nil
	}
	rv := v.(*rendezvous)
	if rv.nodeID != c.NodeID {
		httpapi.WriteError(w, failure.Conflict("call attempt %s is not on node %s", rv.id, c.NodeID))
		return nil
	}
	return rv
}

// callCommand answers an agent that received a reference with the whole
// command.
func (s *Server) callCommand(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	rv := s.fn.lookupRendezvous(w, r, c)
	if rv == nil {
		return
	}
	rv.fetched.Store(true)
	httpapi.WriteJSON(w, http.StatusOK, rv.cmd)
}

// callRequestBody streams the caller's request body to the agent, once.
func (s *Server) callRequestBody(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	rv := s.fn.lookupRendezvous(w, r, c)
	if rv == nil {
		return
	}
	rv.fetched.Store(true)
	if !rv.taken.CompareAndSwap(false, true) {
		httpapi.WriteError(w, failure.Conflict("the request body of call attempt %s was already taken", rv.id))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	if rv.body == nil {
		return
	}
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := rv.body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			// The caller's body broke: the agent must see a broken body,
			// not a complete one.
			panic(http.ErrAbortHandler)
		}
	}
}

// callResponse takes the node's answer: an error, or a response whose
// body is relayed to the caller while this request is open.
func (s *Server) callResponse(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	rv := s.fn.lookupRendezvous(w, r, c)
	if rv == nil {
		return
	}
	rv.fetched.Store(true)
	if kind := r.Header.Get(capability.HeaderCallError); kind != "" {
		msg, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if !rv.deliver(&callAnswer{kind: kind, message: string(msg)}) {
			httpapi.WriteJSON(w, http.StatusGone, api.ErrorOf(failure.Conflict("call attempt %s is over", rv.id)))
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	status, err := strconv.Atoi(r.Header.Get(capability.HeaderCallStatus))
	if err != nil || status < 100 || status > 999 {
		httpapi.WriteError(w, failure.Invalid(capability.HeaderCallStatus, "%q is not an HTTP status", r.Header.Get(capability.HeaderCallStatus)))
		return
	}
	header := http.Header{}
	for k, vs := range r.Header {
		if name, ok := strings.CutPrefix(k, capability.HeaderCallHeader); ok && name != "" {
			header[http.CanonicalHeaderKey(name)] = vs
		}
	}
	a := &callAnswer{status: status, header: header, length: r.ContentLength, body: r.Body,
		trailer: func() http.Header { return r.Trailer }, done: make(chan error, 1)}
	if !rv.deliver(a) {
		httpapi.WriteJSON(w, http.StatusGone, api.ErrorOf(failure.Conflict("call attempt %s is over", rv.id)))
		return
	}
	if err := <-a.done; err != nil {
		// Close the connection rather than answer, so the agent's next
		// write fails and the node stops the call.
		panic(http.ErrAbortHandler)
	}
	w.WriteHeader(http.StatusOK)
}

// callLog takes a durable call's output.
func (s *Server) callLog(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	rv := s.fn.lookupRendezvous(w, r, c)
	if rv == nil {
		return
	}
	text, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	select {
	case rv.logs <- string(text):
	default:
	}
	w.WriteHeader(http.StatusOK)
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
func (fs *fnState) dispatch(ctx context.Context, c *fnCall) callOutcome {
	nodes, fitting, err := fs.candidates(ctx, c.entry)
	if err != nil {
		return callOutcome{kind: kindUnavailable, message: err.Error(), retryable: true}
	}
	if len(nodes) == 0 {
		msg := fmt.Sprintf("no ready node can hold the function (it needs %v)", c.entry.need)
		if fitting > 0 {
			msg = fmt.Sprintf("%d nodes can hold the function (it needs %v) but none is connected to this control plane", fitting, c.entry.need)
		}
		return callOutcome{kind: kindNoCapacity, message: msg, retryable: true}
	}
	tries := min(len(nodes), maxTries)
	var out callOutcome
	for i := 0; i < tries; i++ {
		out = fs.attempt(ctx, c, nodes[i], i == tries-1)
		out.tries = i + 1
		if !out.retryable || ctx.Err() != nil || !fs.s.now().Before(c.deadline) {
			break
		}
		if i < tries-1 {
			fs.metrics.spills.WithLabelValues(c.entry.fn.ID).Inc()
		}
	}
	return out
}

// attempt offers the call to one node and relays its answer.
func (fs *fnState) attempt(ctx context.Context, c *fnCall, n fnNode, last bool) callOutcome {
	remaining := c.deadline.Sub(fs.s.now())
	if remaining <= 0 {
		return callOutcome{kind: kindTimeout, message: "the call's deadline passed before a node took it", nodeID: n.ID}
	}
	spec := c.entry.spec
	cmd := capability.InvokeCommand{
		CallID: c.id, Rendezvous: httpapi.NewID("rv-"), URL: fs.replicaURL(), Function: &spec,
		Header: c.header, ContentLength: c.length, Timeout: remaining, NoWait: !last, Logs: c.logs,
	}
	rv := &rendezvous{id: cmd.Rendezvous, nodeID: n.ID, answered: make(chan struct{}), logs: make(chan string, 1)}
	switch {
	case c.data != nil && len(c.data) <= inlineBody:
		cmd.Body, cmd.BodyInline, cmd.ContentLength = c.data, true, int64(len(c.data))
	case c.data != nil:
		rv.body = bytes.NewReader(c.data)
	default:
		rv.body = c.stream
	}
	rv.cmd = cmd
	fs.rvs.Store(rv.id, rv)
	defer fs.rvs.Delete(rv.id)

	var pickup <-chan time.Time
	if ls := fs.session(n.ID); ls != nil {
		if !fs.send(ls, cmd) {
			return callOutcome{kind: kindBusy, message: "the node's session is backed up", nodeID: n.ID, retryable: true}
		}
		rv.session = ls
	} else if fs.s.coord != nil {
		if err := fs.publish(n.ID, capability.InvokeCommand{CallID: cmd.CallID, Rendezvous: cmd.Rendezvous, URL: cmd.URL,
			ContentLength: cmd.ContentLength, Timeout: cmd.Timeout, NoWait: cmd.NoWait, Logs: cmd.Logs}); err != nil {
			return callOutcome{kind: kindUnreachable, message: "publish to the node's replica: " + err.Error(), nodeID: n.ID, retryable: true}
		}
		t := time.NewTimer(pickupTimeout)
		defer t.Stop()
		pickup = t.C
	} else {
		return callOutcome{kind: kindUnreachable, message: "the node is not connected", nodeID: n.ID, retryable: true}
	}

	timer := time.NewTimer(remaining + answerGrace)
	defer timer.Stop()
	var sessionDone <-chan struct{}
	if rv.session != nil {
		sessionDone = rv.session.done
	}
	out := func() callOutcome {
		for {
			select {
			case <-rv.answered:
				return fs.relay(c, rv)
			case <-sessionDone:
				if rv.abandon() {
					return callOutcome{kind: kindNodeLost, message: "the node's session ended before it answered"}
				}
				return fs.relay(c, rv)
			case <-pickup:
				pickup = nil
				if !rv.fetched.Load() && rv.abandon() {
					return callOutcome{kind: kindUnreachable, message: "no agent took the command within " + pickupTimeout.String(), retryable: true}
				}
			case <-ctx.Done():
				if rv.abandon() {
					if errors.Is(ctx.Err(), context.DeadlineExceeded) {
						return callOutcome{kind: kindTimeout, message: "the call's deadline passed"}
					}
					return callOutcome{kind: kindCanceled, message: "the caller went away"}
				}
				return fs.relay(c, rv)
			case <-timer.C:
				if rv.abandon() {
					return callOutcome{kind: kindTimeout, message: "the node did not answer by the call's deadline"}
				}
				return fs.relay(c, rv)
			}
		}
	}()
	out.nodeID = n.ID
	if out.kind == kindBusy || out.kind == kindRefused {
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

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// relay handles the node's answer: an error as it is, a response by
// copying it to the call's sink as it arrives.
func (fs *fnState) relay(c *fnCall, rv *rendezvous) callOutcome {
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
				out.kind, out.message, done = kindCanceled, "writing to the caller: "+werr.Error(), werr
				break
			}
			if !whole {
				_ = c.sink.Flush()
			}
		}
		if rerr == io.EOF {
			if kind := a.trailer().Get(capability.HeaderCallError); kind != "" {
				out.kind, out.message = kind, a.trailer().Get(capability.HeaderCallMessage)
			}
			break
		}
		if rerr != nil {
			out.kind, out.message, done = kindNodeLost, "the node's response broke off: "+rerr.Error(), rerr
			break
		}
	}
	a.done <- done
	return out
}

// Invoke.

// hopByHop are headers of one connection, never passed on.
var hopByHop = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true}

// invokeHeader is the request's headers as a function invoked by ID sees
// them: as sent, less hop-by-hop headers, Host, Content-Length, and
// Authorization, which carries Mercator's credential.
func invokeHeader(r *http.Request) http.Header {
	h := http.Header{}
	for k, vs := range r.Header {
		if hopByHop[k] || k == "Authorization" || k == "Content-Length" || k == "Host" {
			continue
		}
		h[k] = vs
	}
	return h
}

// triggerHeader is Fn's HTTP-trigger mapping: the client's headers as
// Fn-Http-H-*, the method, the full URL and Fn-Intent, plus Content-Type
// as it is (FDKs read it for the body).
func triggerHeader(r *http.Request) http.Header {
	h := http.Header{}
	for k, vs := range r.Header {
		if hopByHop[k] || k == "Authorization" || k == "Content-Length" || k == "Host" {
			continue
		}
		h["Fn-Http-H-"+k] = vs
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		h.Set("Content-Type", ct)
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	h.Set("Fn-Http-Method", r.Method)
	h.Set("Fn-Http-Request-Url", scheme+"://"+r.Host+r.URL.RequestURI())
	h.Set("Fn-Intent", "httprequest")
	return h
}

// callStatus is the status and Fn's message for a call that ended with
// kind before its response began.
func callStatus(kind string) (int, string) {
	switch kind {
	case kindBusy, kindNoCapacity, kindUnreachable, kindRefused, kindUnavailable:
		return http.StatusServiceUnavailable, "Timed out - server too busy"
	case kindTimeout:
		return http.StatusGatewayTimeout, "Timed out"
	case "image_pull_timeout":
		return http.StatusGatewayTimeout, "Image pull timed out"
	case "image_pull_failed":
		return http.StatusBadGateway, "Failed to pull image"
	case "container_init_failed":
		return http.StatusBadGateway, "Container failed to initialize, please ensure you are using the latest fdk and check the logs"
	case "container_init_timeout":
		return http.StatusGatewayTimeout, "Container initialization timed out, please ensure you are using the latest fdk and check the logs"
	case "out_of_memory", "function_failed":
		return http.StatusBadGateway, "function failed"
	case "invalid_response":
		return http.StatusBadGateway, "invalid function response"
	case "request_too_big":
		return http.StatusRequestEntityTooLarge, "Request content too large"
	case "response_too_big":
		return http.StatusBadGateway, "function response body too large"
	case kindNodeLost:
		return http.StatusBadGateway, "error receiving function response"
	case "invalid":
		return http.StatusBadRequest, "Invalid function configuration"
	case kindCanceled:
		return 499, "Client cancelled context"
	}
	return http.StatusInternalServerError, "internal server error"
}

func (s *Server) fnInvoke(w http.ResponseWriter, r *http.Request) {
	e, err := s.fn.lookupFn(r.Context(), r.PathValue("fn_id"))
	if err != nil {
		s.fnFail(w, err)
		return
	}
	if strings.EqualFold(r.Header.Get("Fn-Invoke-Type"), "detached") {
		s.fn.enqueue(w, r, e, invokeHeader(r))
		return
	}
	s.fn.invokeSync(w, r, e, invokeHeader(r))
}

// fnInvokeAsync (Mercator) is the detached invoke at a path of its own.
func (s *Server) fnInvokeAsync(w http.ResponseWriter, r *http.Request) {
	e, err := s.fn.lookupFn(r.Context(), r.PathValue("fn_id"))
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.fn.enqueue(w, r, e, invokeHeader(r))
}

// fnTrigger serves /t/{app_name}/{source...}: the app's HTTP trigger of
// that source (Fn's "/" for an empty one).
func (s *Server) fnTrigger(w http.ResponseWriter, r *http.Request) {
	source := "/" + r.PathValue("source")
	e, err := s.fn.lookupTrigger(r.Context(), r.PathValue("app_name"), source)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	if strings.EqualFold(r.Header.Get("Fn-Invoke-Type"), "detached") {
		s.fn.enqueue(w, r, e, triggerHeader(r))
		return
	}
	s.fn.invokeSync(w, r, e, triggerHeader(r))
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
func (fs *fnState) invokeSync(w http.ResponseWriter, r *http.Request, e *fnEntry, header http.Header) {
	start := fs.s.now()
	callID := httpapi.NewID("call-")
	if r.ContentLength > api.FnMaxRequestBytes {
		w.Header().Set("Fn-Call-Id", callID)
		httpapi.WriteJSON(w, http.StatusRequestEntityTooLarge, api.FnError{Message: "Request content too large", Kind: "request_too_big",
			Detail: fmt.Sprintf("the body is %d bytes; a function accepts %d", r.ContentLength, api.FnMaxRequestBytes)})
		fs.metrics.observe(e.fn.ID, "request_too_big", 0)
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
		prefix, err := io.ReadAll(io.LimitReader(r.Body, inlineBody+1))
		if err != nil {
			writeFnError(w, http.StatusBadRequest, "Invalid payload")
			return
		}
		if len(prefix) <= inlineBody {
			c.data, c.length = prefix, int64(len(prefix))
		} else {
			c.stream = io.MultiReader(bytes.NewReader(prefix), r.Body)
		}
	} else {
		c.data, c.length = []byte{}, 0
	}
	ctx, cancel := context.WithDeadline(r.Context(), c.deadline.Add(answerGrace))
	defer cancel()
	out := fs.dispatch(ctx, c)
	fs.metrics.observe(e.fn.ID, out.kind, fs.s.now().Sub(start))
	if out.kind == "" {
		return
	}
	if out.started {
		// The status line is gone; the one honest thing left is to cut
		// the response off so the caller does not take it for whole.
		fs.log.Warn("function call broke off after its response began", "fn", e.fn.ID, "call", callID, "node", out.nodeID, "kind", out.kind, "err", out.message)
		panic(http.ErrAbortHandler)
	}
	if out.kind == kindCanceled && r.Context().Err() != nil {
		return
	}
	status, msg := callStatus(out.kind)
	w.Header().Set("Fn-Call-Id", callID)
	httpapi.WriteJSON(w, status, api.FnError{Message: msg, Kind: out.kind, Detail: out.message})
}
