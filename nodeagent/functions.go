package nodeagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/fnagent"
	"github.com/mercator/mercator/nodeproto"
)

// Functions on the node: the agent serves invoke commands through one
// fnagent.Engine. The agent never listens, so a call's bodies travel over
// requests the agent opens to the control-plane replica holding the caller
// (see nodeproto.PathCalls): the request body is read from it only when
// the function reads it, and the response is posted as it is written, as
// one streamed request body, never buffered whole.
//
// Invoke commands are not operations: they are never stored, never
// redelivered, and produce no result event. A lost one is the control
// plane's to notice (the node's session ended, or the caller's deadline
// passed) and, for a durable call, to deliver again.
//
// Runs and functions share the machine. The agent sets a fixed share aside
// for function containers (FunctionShare) and says so in its facts
// (nodeproto.NodeFacts.Functions); the control plane places calls only
// where the share can hold the function, and the scheduler counts the share
// as used when it places Runs. Function containers carry dockerengine.LabelFn
// and never LabelRun, so Observe, which lists only containers with
// LabelRun, never reports them as workloads.

// FunctionShare is the part of the machine set aside for function
// containers.
type FunctionShare struct {
	MemoryBytes int64
	MilliCPUs   int64
	// GPUs are the UUIDs of the accelerators functions may use; Runs are
	// never given them.
	GPUs []string
}

// agentFunctions is the agent's Functions side.
type agentFunctions struct {
	engine *fnagent.Engine
	share  FunctionShare
	client *http.Client
	log    *slog.Logger

	mu               sync.Mutex
	seen, seenBefore map[string]bool // rendezvous IDs served recently

	jobs chan func() // to an idle worker

	answers map[string]*answerStream // by replica URL, under mu (functions_answers.go)
	// answersOnBody holds, by replica URL, until when its streams are
	// opened on a request body (it declined the connection), under mu.
	answersOnBody map[string]time.Time
	answersIdle   time.Duration // answersIdle when zero; tests shorten it
}

// WithFunctions makes the agent serve invoke commands through engine, whose
// tracker must hold exactly share. The caller owns the engine and closes it
// after Run returns. Without this option the agent answers every invoke
// with an error saying it runs no functions.
func WithFunctions(engine *fnagent.Engine, share FunctionShare) Option {
	return func(a *Agent) {
		a.functions = &agentFunctions{
			engine: engine,
			share:  share,
			// One connection per concurrent call is kept alive, so a hot
			// call costs no TCP handshake.
			client: &http.Client{Transport: &http.Transport{
				Proxy:               http.ProxyFromEnvironment,
				DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
				MaxIdleConns:        256,
				MaxIdleConnsPerHost: 128,
				IdleConnTimeout:     90 * time.Second,
				DisableCompression:  true,
			}},
			seen: map[string]bool{},
			jobs: make(chan func()),
		}
	}
}

// functionFacts is the share and its containers, for the node's facts.
func (a *Agent) functionFacts() *nodeproto.FunctionCapacity {
	f := a.functions
	if f == nil {
		return nil
	}
	fc := &nodeproto.FunctionCapacity{MemoryBytes: f.share.MemoryBytes, MilliCPUs: f.share.MilliCPUs, GPUs: append([]string(nil), f.share.GPUs...),
		OutputRelay: f.engine.OutputRelayed()}
	byFn := map[string]*nodeproto.FunctionContainers{}
	for _, p := range f.engine.Stats() {
		c := byFn[p.FnID]
		if c == nil {
			c = &nodeproto.FunctionContainers{FnID: p.FnID}
			byFn[p.FnID] = c
		}
		c.Idle += p.Idle
		c.Paused += p.Paused
		c.Busy += p.Busy
		c.Starting += p.Starting
		c.Prepared += p.Prepared
	}
	for _, c := range byFn {
		if c.Idle+c.Busy+c.Starting+c.Prepared > 0 {
			fc.Containers = append(fc.Containers, *c)
		}
	}
	sort.Slice(fc.Containers, func(i, j int) bool { return fc.Containers[i].FnID < fc.Containers[j].FnID })
	return fc
}

// firstDelivery reports whether the rendezvous is new to this agent. Two
// sessions may carry the same command in the moment one replaces the other;
// it must run once. The memory is two generations of recentDeliveries IDs
// each, which outlasts any such overlap by far and costs O(1) per call.
func (f *agentFunctions) firstDelivery(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen[id] || f.seenBefore[id] {
		return false
	}
	if len(f.seen) >= recentDeliveries {
		f.seenBefore, f.seen = f.seen, make(map[string]bool, recentDeliveries)
	}
	f.seen[id] = true
	return true
}

const recentDeliveries = 4096

// invoke serves one invoke command: it hands the call to a worker and
// returns at once, without blocking on the network or the engine, so the
// session loop calls it inline (a goroutine per call cost the agent
// measurable CPU per call). The worker returns once the call's outcome was
// posted (or could not be).
func (a *Agent) invoke(ctx context.Context, cmd nodeproto.Command) {
	inv := cmd.Invoke
	if inv == nil || inv.Rendezvous == "" || inv.URL == "" {
		a.logger.Warn("invoke command without a rendezvous; ignoring it")
		return
	}
	f := a.functions
	if f == nil {
		go (&agentFunctions{client: a.controlPlaneClient()}).postError(ctx, a, *inv, fnagent.KindInvalid, "this agent runs no functions (it was started without them)")
		return
	}
	if !f.firstDelivery(inv.Rendezvous) {
		return
	}
	var job func()
	if held := a.state.FencingToken(); cmd.FencingToken < held {
		job = func() {
			f.postError(ctx, a, *inv, "refused", fmt.Sprintf("command fenced at token %d, below this node's token %d", cmd.FencingToken, held))
		}
	} else {
		job = func() {
			if inv.Function == nil {
				full, err := f.fetchCommand(ctx, a, *inv)
				if err != nil {
					a.logger.Warn("fetch invoke command", "rendezvous", inv.Rendezvous, "err", err)
					return
				}
				inv = &full
			}
			f.serve(ctx, a, *inv)
		}
	}
	select {
	case f.jobs <- job:
	default:
		go f.worker(job)
	}
}

// worker runs calls, and waits for the next one for workerIdle before it
// ends. Reusing goroutines spares each call a fresh stack grown to the
// depth of an engine call (a measurable share of the agent's CPU per call).
func (f *agentFunctions) worker(job func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		job()
		idle.Reset(workerIdle)
		select {
		case job = <-f.jobs:
		case <-idle.C:
			return
		}
	}
}

const workerIdle = 10 * time.Second

// nodeRequest is a request to a calls path, authenticated as this node.
func (a *Agent) nodeRequest(ctx context.Context, method string, inv nodeproto.InvokeCommand, suffix string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(inv.URL, "/")+nodeproto.PathCalls+inv.Rendezvous+suffix, body)
	if err != nil {
		return nil, err
	}
	nodeID, tok := a.creds()
	req.Header.Set(nodeproto.HeaderNodeID, nodeID)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("User-Agent", "mercator-agent")
	return req, nil
}

// fetchCommand reads the whole command of a rendezvous whose session
// carried a reference only.
func (f *agentFunctions) fetchCommand(ctx context.Context, a *Agent, inv nodeproto.InvokeCommand) (nodeproto.InvokeCommand, error) {
	req, err := a.nodeRequest(ctx, http.MethodGet, inv, "", nil)
	if err != nil {
		return inv, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return inv, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return inv, decodeError(resp)
	}
	var full nodeproto.InvokeCommand
	if err := json.NewDecoder(resp.Body).Decode(&full); err != nil {
		return inv, fmt.Errorf("decode invoke command: %w", err)
	}
	if full.Function == nil {
		return inv, errors.New("the control plane's command carries no function")
	}
	return full, nil
}

// postError reports a call that ended before any of its response was
// written.
func (f *agentFunctions) postError(ctx context.Context, a *Agent, inv nodeproto.InvokeCommand, kind fnagent.Kind, message string) {
	if f.answerOnStream(ctx, a, inv, nodeproto.CallAnswer{ErrorKind: string(kind), ErrorMessage: message}) {
		return
	}
	req, err := a.nodeRequest(ctx, http.MethodPost, inv, "/response", strings.NewReader(message))
	if err != nil {
		return
	}
	req.Header.Set(nodeproto.HeaderCallError, string(kind))
	req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	resp, err := f.client.Do(req)
	if err != nil {
		a.logger.Debug("post call error", "rendezvous", inv.Rendezvous, "err", err)
		return
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// functionConfig is the engine's configuration for spec.
func functionConfig(spec nodeproto.FunctionSpec) fnagent.FunctionConfig {
	return fnagent.FunctionConfig{
		ID: spec.ID, AppID: spec.AppID, Name: spec.Name, AppName: spec.AppName,
		Image: spec.Image, RegistryAuth: spec.RegistryAuth,
		MemoryMB: spec.MemoryMB, MilliCPUs: spec.MilliCPUs, GPUs: spec.GPUs,
		Config: spec.Config, Timeout: spec.Timeout, IdleTimeout: spec.IdleTimeout,
		MaxConcurrency: spec.MaxConcurrency, TargetConcurrency: spec.TargetConcurrency, UnframedLogs: spec.UnframedLogs,
	}
}

// serve runs the call through the engine and posts its outcome.
func (f *agentFunctions) serve(ctx context.Context, a *Agent, inv nodeproto.InvokeCommand) {
	var body io.Reader
	var lazy *lazyBody
	switch {
	case inv.BodyInline:
		body = bytes.NewReader(inv.Body)
	case inv.ContentLength != 0:
		lazy = &lazyBody{open: func() (io.ReadCloser, error) { return f.openRequestBody(ctx, a, inv) }}
		body = lazy
	}
	call := fnagent.CallRequest{
		ID:            inv.CallID,
		Header:        http.Header(inv.Header),
		Body:          body,
		ContentLength: inv.ContentLength,
		Mode:          fnagent.Wait,
	}
	if inv.BodyInline {
		call.ContentLength = int64(len(inv.Body))
	}
	if inv.Timeout > 0 {
		call.Deadline = a.now().Add(inv.Timeout)
	}
	if inv.NoWait {
		call.Mode = fnagent.NoWait
	}
	w := &callWriter{ctx: ctx, a: a, f: f, inv: inv, header: http.Header{}}
	_, err := f.engine.Call(ctx, functionConfig(*inv.Function), call, w)
	if lazy != nil {
		lazy.close()
	}
	var ce *fnagent.CallError
	if errors.As(err, &ce) && !ce.Partial && !w.started() {
		f.postError(ctx, a, inv, ce.Kind, ce.Error())
	} else {
		w.finish(err)
	}
	if inv.Logs {
		f.postLog(ctx, a, inv)
	}
}

// openRequestBody streams the caller's request body from the control plane.
func (f *agentFunctions) openRequestBody(ctx context.Context, a *Agent, inv nodeproto.InvokeCommand) (io.ReadCloser, error) {
	req, err := a.nodeRequest(ctx, http.MethodGet, inv, "/request", nil)
	if err != nil {
		return nil, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp.Body, nil
}

// logSettle is how long after a durable call's response its output is
// read: the container's output reaches the engine through the daemon's
// attach stream, a little after the function wrote it.
const logSettle = 250 * time.Millisecond

// postLog sends the call's output as the node kept it.
func (f *agentFunctions) postLog(ctx context.Context, a *Agent, inv nodeproto.InvokeCommand) {
	if !sleep(ctx, logSettle) {
		return
	}
	var text string
	if log, ok := f.engine.Logs(inv.CallID); ok {
		text = log.String()
	}
	req, err := a.nodeRequest(ctx, http.MethodPost, inv, "/log", strings.NewReader(text))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	resp, err := f.client.Do(req)
	if err != nil {
		a.logger.Debug("post call log", "rendezvous", inv.Rendezvous, "err", err)
		return
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// lazyBody opens the request body on the first Read, so a call that ends
// before its function reads anything (busy, a failed start) leaves the
// caller's body untouched for the next node to take.
type lazyBody struct {
	open func() (io.ReadCloser, error)
	mu   sync.Mutex
	rc   io.ReadCloser
	err  error
}

func (b *lazyBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.rc == nil && b.err == nil {
		b.rc, b.err = b.open()
	}
	rc, err := b.rc, b.err
	b.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return rc.Read(p)
}

func (b *lazyBody) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rc != nil {
		b.rc.Close()
	}
	if b.err == nil {
		b.err = io.ErrClosedPipe
	}
}

// Coalescing: a response is held in the agent until it is complete, or
// until coalesceWindow has passed since the function began to answer, or
// until it exceeds coalesceMax, whichever comes first. A quick, small
// response (nearly every call) then travels as one POST with its length,
// which the control plane passes to the caller with its length, in one
// write each way; a slow or large one is streamed from that moment on, so
// the first byte waits at most coalesceWindow and nothing is held whole.
const (
	coalesceWindow = 2 * time.Millisecond
	coalesceMax    = 64 << 10
)

// callWriter is the engine's http.ResponseWriter for one call (see
// Coalescing above). Once streaming, the response is the body of one POST
// whose tail is a pipe the engine's writes feed: a write returns once the
// transport took the bytes, and fails once the control plane stops reading
// (the caller went away), which the engine reports as the call canceled.
type callWriter struct {
	ctx    context.Context
	a      *Agent
	f      *agentFunctions
	inv    nodeproto.InvokeCommand
	header http.Header

	mu        sync.Mutex
	status    int // 0 until WriteHeader
	buf       []byte
	timer     *time.Timer
	streaming bool
	done      bool

	pw     *io.PipeWriter
	req    *http.Request
	posted chan error
}

func (w *callWriter) Header() http.Header { return w.header }

func (w *callWriter) WriteHeader(status int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writeHeaderLocked(status)
}

func (w *callWriter) writeHeaderLocked(status int) {
	if w.status != 0 {
		return
	}
	w.status = status
	w.timer = time.AfterFunc(coalesceWindow, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if !w.done && !w.streaming {
			w.streamLocked()
		}
	})
}

// started reports whether the function began its response.
func (w *callWriter) started() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status != 0
}

// newResponse is the POST of the response with its status and headers.
func (w *callWriter) newResponse(body io.Reader) (*http.Request, error) {
	req, err := w.a.nodeRequest(w.ctx, http.MethodPost, w.inv, "/response", body)
	if err != nil {
		return nil, err
	}
	req.Header.Set(nodeproto.HeaderCallStatus, strconv.Itoa(w.status))
	for k, vs := range w.header {
		for _, v := range vs {
			req.Header.Add(nodeproto.HeaderCallHeader+k, v)
		}
	}
	return req, nil
}

// streamLocked starts the streamed POST: what is held, then the pipe.
func (w *callWriter) streamLocked() {
	w.streaming = true
	pr, pw := io.Pipe()
	w.pw, w.posted = pw, make(chan error, 1)
	req, err := w.newResponse(io.MultiReader(bytes.NewReader(w.buf), pr))
	w.buf = nil
	if err != nil {
		pw.CloseWithError(err)
		w.posted <- err
		return
	}
	req.ContentLength = -1
	req.Trailer = http.Header{nodeproto.HeaderCallError: nil, nodeproto.HeaderCallMessage: nil}
	w.req = req
	go func() {
		err := w.f.post(req)
		// Unblock a write still waiting: nobody reads the pipe any more.
		pr.CloseWithError(errResponseGone)
		w.posted <- err
	}()
}

// post sends a response request and reads the control plane's answer.
func (f *agentFunctions) post(req *http.Request) error {
	resp, err := f.client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the control plane answered %s", resp.Status)
	}
	return nil
}

var errResponseGone = errors.New("the control plane stopped taking the response")

func (w *callWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writeHeaderLocked(http.StatusOK)
	if !w.streaming {
		if len(w.buf)+len(p) <= coalesceMax {
			w.buf = append(w.buf, p...)
			w.mu.Unlock()
			return len(p), nil
		}
		w.streamLocked()
	}
	pw := w.pw
	w.mu.Unlock()
	return pw.Write(p)
}

// Flush does nothing: what is held goes at the end of the window, and a
// streaming write returns only once the transport took the bytes, which it
// flushes after each chunk.
func (w *callWriter) Flush() {}

// finish ends the call's answer. A response still held is sent whole (or,
// if the call broke before any of it left the node, replaced by the
// error); a streaming one is ended cleanly, or, when err says the call
// broke, with the error in the trailers.
func (w *callWriter) finish(err error) {
	w.mu.Lock()
	w.writeHeaderLocked(http.StatusOK)
	w.done = true
	w.timer.Stop()
	if !w.streaming {
		buf := w.buf
		w.mu.Unlock()
		if err != nil {
			w.f.postError(w.ctx, w.a, w.inv, errKind(err), err.Error())
			return
		}
		if w.f.answerOnStream(w.ctx, w.a, w.inv, nodeproto.CallAnswer{Status: w.status, Header: w.header, Body: buf}) {
			return
		}
		req, rerr := w.newResponse(bytes.NewReader(buf))
		if rerr == nil {
			rerr = w.f.post(req)
		}
		if rerr != nil && !errors.Is(rerr, context.Canceled) {
			w.a.logger.Debug("post call response", "rendezvous", w.inv.Rendezvous, "err", rerr)
		}
		return
	}
	w.mu.Unlock()
	if w.req != nil && err != nil {
		// An empty write returns once the transport reads the body, so it
		// has written the request's head (and read Trailer's keys) and
		// setting the values cannot race with it.
		_, _ = w.pw.Write(nil)
		w.req.Trailer.Set(nodeproto.HeaderCallError, string(errKind(err)))
		w.req.Trailer.Set(nodeproto.HeaderCallMessage, sanitizeTrailer(err.Error()))
	}
	w.pw.Close()
	if perr := <-w.posted; perr != nil && !errors.Is(perr, context.Canceled) {
		w.a.logger.Debug("post call response", "rendezvous", w.inv.Rendezvous, "err", perr)
	}
}

func errKind(err error) fnagent.Kind {
	if kind := fnagent.KindOf(err); kind != "" {
		return kind
	}
	return fnagent.KindInvalidResponse
}

// sanitizeTrailer makes s fit a header value: one line, bounded.
func sanitizeTrailer(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 2048 {
		s = s[:2048]
	}
	return s
}

// FunctionsOptions configures the agent's Functions engine. Zero values
// take the defaults named.
type FunctionsOptions struct {
	// Disabled runs no functions: the agent reports no share and answers
	// invokes with an error.
	Disabled bool
	// MemoryBytes is the memory set aside for function containers; 0 means
	// a quarter of what the machine can give containers (its memory, or
	// its cgroup's limit, less fnagent.DefaultHeadroom).
	MemoryBytes int64
	// MilliCPUs is the CPU set aside (thousandths of a core) for functions
	// that ask for a CPU reservation; 0 means a quarter of the machine's.
	MilliCPUs int64
	// GPUs is how many accelerators are set aside for functions, taken
	// from the end of the vendor tool's list; 0 means none.
	GPUs int
	// SocketRoot is where the containers' socket directories live (default
	// STATE_DIR/fn-sockets); it must be on this machine.
	SocketRoot string
	// Network is the containers' Docker network ("" is the daemon's
	// default bridge).
	Network string
	// Spares is fnagent.Config.MaxSpares: how many functions without a
	// hold keep a prepared container on this node (0, the default:
	// fnagent.DefaultMaxSpares; negative: none).
	Spares int
	// NetnsPool is fnagent.Config.NetnsPool: how many network namespaces
	// are kept ready for cold starts (0, the default:
	// fnagent.DefaultNetnsPool; negative: none).
	NetnsPool int
	// OutputRelay is fnagent.Config.OutputRelay: the statically linked
	// mercator binary mounted into function containers to carry their
	// output past the daemon ("" for none).
	OutputRelay string
}
