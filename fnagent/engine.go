package fnagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/fnagent/outputrelay"
)

// Engine runs hot function containers on this node and serves calls to
// them. See the package doc for the model. Create it with New; it is safe
// for concurrent use; Close it to remove its containers.
type Engine struct {
	cfg Config
	api dockerengine.API
	// ownsClient is whether the engine made api, and so Closes it.
	ownsClient bool
	tracker    *ResourceTracker
	logs       *logStore
	metrics    Metrics
	log        *slog.Logger
	now        func() time.Time

	// ctx ends at Close; launches and pulls run under it, not under the
	// call that asked for them, because the next call wants them too.
	ctx    context.Context
	cancel context.CancelFunc
	bg     sync.WaitGroup // background work: launches, pulls, removals
	calls  sync.WaitGroup // calls in flight

	// closing is closed when Close begins, so waiting calls give up.
	closing chan struct{}

	mu         sync.Mutex
	closed     bool
	pools      map[string]*pool
	containers map[*hotContainer]struct{}
	wake       chan struct{} // closed and replaced by signal

	pulls   dockerengine.Pulls
	configs configCache
	// makePipes is outputrelay.Make, or a test's failure.
	makePipes func(dir string) (*outputrelay.Pipes, error)
	// relayRefused is set when the daemon could not mount
	// Config.OutputRelay: no container uses it from then on.
	relayRefused atomic.Bool
	// present are the images the daemon was seen to hold (docker.go),
	// with their commands, so a launch does not ask again; guarded by mu.
	present map[string][]string
	// holderImage is the network namespace holders' image (netns.go).
	holderImage holderImage
	// netnsPool is the holders started ahead for no function yet, and
	// poolFilling whether they are being made (netnspool.go); guarded by
	// mu. poolPrefix starts this engine's pooled holders' labels.
	netnsPool   []string
	poolFilling bool
	poolPrefix  string
	// starts counts the launches in the daemon's start of their
	// container, which holders' starts wait out (netns.go); guarded by mu.
	starts int
}

// pool is the hot containers of one function configuration.
type pool struct {
	key string
	fn  FunctionConfig
	res Resources
	q   *slotQueue[*hotContainer]

	// Guarded by Engine.mu. A pool leaves the map only when no call uses
	// it and it has no container, so two pools never share a key.
	refs int
	live int
	auth string // the latest call's registry credential
	// minHot containers are kept started until holdUntil (Engine.Hold).
	minHot    int
	holdUntil time.Time
	// prepared is a container created ahead for the pool's next launch,
	// preparing whether one is being made (prepare.go); lastUse is the
	// latest call or hold, which keeps it (Config.SpareFor) and ranks it
	// when Config.MaxSpares is reached.
	prepared  *hotContainer
	preparing bool
	// prepDone is closed when the preparing ends; prepAwaited says a
	// launch waits for it (awaitPrepared).
	prepDone    chan struct{}
	prepAwaited bool
	lastUse     time.Time
	expiry      *time.Timer // the pending check of prepared (expirePrepared)
}

// New connects to the Docker daemon (Config.DockerHost, else the
// environment) and returns an engine. The API version is negotiated on
// first use, so an older daemon works. No container request is made here;
// when Config.Tracker is nil the machine's capacity is measured now.
func New(cfg Config) (*Engine, error) {
	if cfg.Docker != nil {
		e, err := newEngine(cfg.Docker, cfg)
		if err == nil {
			e.ownsClient = false
		}
		return e, err
	}
	cli, err := dockerengine.NewClient(cfg.DockerHost)
	if err != nil {
		return nil, failure.Invalid("docker_host", "%v", err)
	}
	e, err := newEngine(cli, cfg)
	if err != nil {
		cli.Close()
		return nil, err
	}
	return e, nil
}

// OutputRelayed reports whether the engine's containers run through its
// output relay (Config.OutputRelay): one is set and the daemon has not
// refused to mount it. A container may still go without it (an image with
// no command, a small function, pipes that could not be made).
func (e *Engine) OutputRelayed() bool {
	return e.cfg.OutputRelay != "" && !e.relayRefused.Load()
}

func newEngine(api dockerengine.API, cfg Config) (*Engine, error) {
	if cfg.SocketRoot == "" {
		cfg.SocketRoot = filepath.Join(os.TempDir(), "mercator-fn")
	}
	if cfg.PauseAfter == 0 {
		cfg.PauseAfter = DefaultPauseAfter
	}
	if cfg.MaxSlotWait <= 0 {
		cfg.MaxSlotWait = DefaultMaxSlotWait
	}
	if cfg.PullTimeout <= 0 {
		cfg.PullTimeout = DefaultPullTimeout
	}
	if cfg.MaxLogBytes <= 0 {
		cfg.MaxLogBytes = DefaultMaxLogBytes
	}
	if cfg.LogRetention <= 0 {
		cfg.LogRetention = DefaultLogRetention
	}
	if cfg.MaxSpares == 0 {
		cfg.MaxSpares = DefaultMaxSpares
	}
	if cfg.SpareFor <= 0 {
		cfg.SpareFor = DefaultSpareFor
	}
	switch {
	case cfg.NetnsPool == 0:
		cfg.NetnsPool = DefaultNetnsPool
	case cfg.NetnsPool < 0:
		cfg.NetnsPool = 0
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Containment == nil {
		c := dockerengine.DefaultContainment()
		cfg.Containment = &c
	}
	if err := cfg.Containment.Check(); err != nil {
		return nil, failure.Invalid("containment", "%v", err)
	}
	if cfg.OutputRelay != "" {
		if err := outputrelay.CheckStatic(cfg.OutputRelay); err != nil {
			return nil, failure.Invalid("output relay", "%v", err)
		}
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tracker := cfg.Tracker
	if tracker == nil {
		capacity, err := DetectCapacity(cfg.HeadroomBytes)
		if err != nil {
			return nil, fmt.Errorf("fnagent: measure this machine's capacity: %w", err)
		}
		tracker = NewResourceTracker(capacity)
	}
	if err := os.MkdirAll(cfg.SocketRoot, 0o711); err != nil {
		return nil, fmt.Errorf("fnagent: socket root: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{
		cfg:        cfg,
		api:        api,
		ownsClient: true,
		tracker:    tracker,
		logs:       newLogStore(cfg.MaxLogBytes, cfg.LogRetention),
		metrics:    cfg.Metrics,
		log:        logger,
		now:        cfg.Now,
		ctx:        ctx,
		cancel:     cancel,
		closing:    make(chan struct{}),
		pools:      map[string]*pool{},
		containers: map[*hotContainer]struct{}{},
		wake:       make(chan struct{}),
		present:    map[string][]string{},
		makePipes:  outputrelay.Make,
	}
	e.pulls = dockerengine.Pulls{Keep: true, Background: &e.bg}
	e.poolPrefix = "pool-" + randomHex(4) + "-"
	e.mu.Lock()
	e.fillPoolLocked() // netnspool.go
	e.mu.Unlock()
	return e, nil
}

// Tracker is the engine's resource tracker.
func (e *Engine) Tracker() *ResourceTracker { return e.tracker }

// Logs returns what the container wrote during the call callID (see
// logSink for how output is attributed), for the most recent
// Config.LogRetention calls. Output a function writes after its response
// counts until its container's next call starts, so a read right after Call
// returns may not be final. ok is false for an unknown or forgotten call.
func (e *Engine) Logs(callID string) (log CallLog, ok bool) { return e.logs.get(callID) }

// PoolStats are the counts of one pool at one moment.
type PoolStats struct {
	FnID string
	// Key identifies the configuration (the mercator.fn.pool label).
	Key string
	// Idle includes Paused.
	Idle, Paused, Busy, Starting, Waiting int
	// Prepared counts a container created ahead for the next launch
	// (prepare.go), not among the others.
	Prepared int
}

// Stats returns every pool's counts, sorted by function ID and key.
func (e *Engine) Stats() []PoolStats {
	e.mu.Lock()
	pools := make([]*pool, 0, len(e.pools))
	for _, p := range e.pools {
		pools = append(pools, p)
	}
	paused, prepared := map[*pool]int{}, map[*pool]int{}
	for _, p := range pools {
		if p.prepared != nil {
			prepared[p] = 1
		}
	}
	for c := range e.containers {
		c.stateMu.Lock()
		if c.state == ContainerPaused {
			paused[c.pool]++
		}
		c.stateMu.Unlock()
	}
	e.mu.Unlock()
	stats := make([]PoolStats, 0, len(pools))
	for _, p := range pools {
		s := p.q.stats()
		stats = append(stats, PoolStats{FnID: p.fn.ID, Key: p.key, Idle: s.Idle, Paused: paused[p], Busy: s.Busy, Starting: s.Starting, Waiting: s.Waiting,
			Prepared: prepared[p]})
	}
	sort.Slice(stats, func(i, j int) bool {
		if stats[i].FnID != stats[j].FnID {
			return stats[i].FnID < stats[j].FnID
		}
		return stats[i].Key < stats[j].Key
	})
	return stats
}

// Call runs one call of fn and streams its response to w: the function's
// status and headers (unwrapped from the Fn-Http-* contract), then its body
// as the container writes it, flushed after every read when w supports
// flushing. It returns when the response has been written, or with a
// *CallError saying how the call ended otherwise (see Kind). When the
// error's Partial is false nothing was written to w and the caller writes
// its own error response; when true the response is incomplete and must be
// aborted.
//
// The call may take an idle container, wait for one (Mode), or have one
// launched. Its deadline is the earliest of call.Deadline, ctx's deadline,
// and arrival plus fn.Timeout, and bounds everything, the wait included.
// The report is filled as far as the call got, error or not.
func (e *Engine) Call(ctx context.Context, fn FunctionConfig, call CallRequest, w http.ResponseWriter) (CallReport, error) {
	start := e.now()
	report := CallReport{CallID: call.ID, FnID: fn.ID}
	err := e.call(ctx, fn, call, w, start, &report)
	report.Duration = e.now().Sub(start)
	if err != nil {
		var ce *CallError
		if !errors.As(err, &ce) {
			ce = &CallError{Kind: KindInvalidResponse, Message: err.Error(), Err: err}
		}
		// Copy: a launch's error can reach several calls.
		stamped := *ce
		stamped.FnID, stamped.CallID = fn.ID, call.ID
		err = &stamped
		report.Kind = stamped.Kind
	}
	if e.metrics != nil {
		e.metrics.CallDone(report)
	}
	return report, err
}

func (e *Engine) call(ctx context.Context, fn FunctionConfig, call CallRequest, w http.ResponseWriter, start time.Time, report *CallReport) error {
	fn, key, err := e.configs.normalize(fn)
	if err != nil {
		return &CallError{Kind: KindInvalid, Message: err.Error(), Err: err}
	}
	if call.ID == "" {
		err := failure.Invalid("call_id", "a call needs an ID")
		return &CallError{Kind: KindInvalid, Message: err.Error(), Err: err}
	}
	if w == nil {
		err := failure.Invalid("response_writer", "a call needs somewhere to write its response")
		return &CallError{Kind: KindInvalid, Message: err.Error(), Err: err}
	}
	if need := fn.resources(); !e.tracker.Possible(need) {
		c := e.tracker.Capacity()
		return callErr(KindBusy, nil, "the function needs %v and this node can give at most %v", need,
			Resources{MemoryBytes: c.MemoryBytes, MilliCPUs: c.MilliCPUs, GPUs: len(c.GPUs)})
	}
	deadline := start.Add(fn.Timeout)
	if !call.Deadline.IsZero() && call.Deadline.Before(deadline) {
		deadline = call.Deadline
	}
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if !deadline.After(start) {
		return callErr(KindTimeout, nil, "the deadline passed before the call arrived")
	}
	length := call.ContentLength
	if call.Body == nil {
		length = 0
	}
	if length > fn.MaxRequestBytes {
		return callErr(KindRequestTooBig, nil, "the request body is %d bytes; the function accepts %d", length, fn.MaxRequestBytes)
	}

	p, err := e.acquirePool(fn, key)
	if err != nil {
		return err
	}
	defer e.releasePool(p)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	c, err := e.acquire(ctx, p, call.Mode)
	if err != nil {
		return err
	}
	report.ContainerID = c.id
	report.Cold = c.served.Add(1) == 1
	if report.Cold {
		times := c.launched
		report.Launch = &times
	}
	report.Wait = e.now().Sub(start)
	e.aheadOfDemand(p) // a held pool grows before the next call needs it (hold.go)
	return e.dispatch(ctx, p, c, call, length, w, deadline, report)
}

// acquirePool finds or makes the pool of fn (normalized, with its pool
// key) and counts a call on it.
func (e *Engine) acquirePool(fn FunctionConfig, key string) (*pool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, callErr(KindBusy, nil, "the engine is closing")
	}
	p := e.poolLocked(fn, key)
	p.refs++
	p.auth = fn.RegistryAuth
	p.lastUse = e.now()
	e.calls.Add(1)
	return p, nil
}

// poolLocked finds or makes the pool of fn (normalized, with its pool
// key). A new pool of a function that has others (its image or
// configuration changed) supersedes their prepared containers
// (supersedeLocked).
func (e *Engine) poolLocked(fn FunctionConfig, key string) *pool {
	p := e.pools[key]
	if p == nil {
		p = &pool{key: key, fn: fn, res: fn.resources(), q: newSlotQueue[*hotContainer](fn.MaxConcurrency, e.now).withTarget(fn.TargetConcurrency)}
		e.pools[key] = p
		e.supersedeLocked(p)
	}
	return p
}

func (e *Engine) releasePool(p *pool) {
	e.mu.Lock()
	p.refs--
	e.dropPoolLocked(p)
	e.mu.Unlock()
	e.calls.Done()
}

func (e *Engine) dropPoolLocked(p *pool) {
	if p.refs == 0 && p.live == 0 && e.pools[p.key] == p {
		delete(e.pools, p.key)
	}
}

// signal wakes every call waiting for a container to look again: capacity
// was released, a container went idle (and may be evicted), or a slot
// under MaxConcurrency opened.
func (e *Engine) signal() {
	e.mu.Lock()
	close(e.wake)
	e.wake = make(chan struct{})
	e.mu.Unlock()
}

func (e *Engine) wakeChan() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.wake
}

// goBackground runs f as background work, unless the engine is closing.
func (e *Engine) goBackground(f func()) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.goBackgroundLocked(f)
}

// goBackgroundLocked is goBackground with Engine.mu held.
func (e *Engine) goBackgroundLocked(f func()) bool {
	if e.closed {
		return false
	}
	e.bg.Add(1)
	go func() {
		defer e.bg.Done()
		f()
	}()
	return true
}

// ctxError is the error of a call whose context ended during phase.
func ctxError(ctx context.Context, phase string) *CallError {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return callErr(KindTimeout, ctx.Err(), "the deadline passed %s", phase)
	}
	return callErr(KindCanceled, ctx.Err(), "the caller gave up %s", phase)
}

// acquire returns a running, unpaused container of p marked busy.
func (e *Engine) acquire(ctx context.Context, p *pool, mode Mode) (*hotContainer, error) {
	for {
		c, err := e.slot(ctx, p, mode)
		if err != nil {
			return nil, err
		}
		if err := e.resume(ctx, c); err != nil {
			e.log.Warn("function container unusable; replacing it", "container", c.name, "err", err)
			p.q.retire()
			e.destroyAsync(c, "could not be resumed")
			if ctx.Err() != nil {
				return nil, ctxError(ctx, "waiting for a container")
			}
			continue
		}
		return c, nil
	}
}

// slot takes an idle container, or queues for one and sees that a launch
// is under way when the pool's rules call for one (see slotQueue).
//
// The wait ends at the call's deadline. Config.MaxSlotWait ends it sooner
// when nothing is being done for the pool: the cap is checked each time it
// elapses, and while a launch of the pool is in flight the call keeps
// waiting, because a cold start (bounded itself by PullTimeout and
// InitTimeout) is progress, where waiting on capacity or on other calls'
// containers may not be.
func (e *Engine) slot(ctx context.Context, p *pool, mode Mode) (*hotContainer, error) {
	c, w, err := p.q.acquire(mode == NoWait)
	if errors.Is(err, errSlotLimit) {
		return nil, callErr(KindBusy, nil, "the function is at its max concurrency (%d)", p.fn.MaxConcurrency)
	}
	if w == nil {
		return c, nil
	}
	if w.targeted {
		res, err := e.reserve(p)
		if err != nil {
			p.q.unclaim()
			if c, ok := p.q.cancel(w); ok {
				return c, nil
			}
			return nil, err
		}
		e.startLaunch(p, res, w)
	}
	capTimer := time.NewTimer(e.cfg.MaxSlotWait)
	defer capTimer.Stop()
	for {
		wake, freed := e.wakeChan(), e.tracker.Changed()
		if mode == Wait || !w.targeted {
			e.fillLaunches(p)
		}
		select {
		case g := <-w.ch:
			if g.err != nil {
				return nil, g.err
			}
			return g.slot, nil
		case <-wake:
		case <-freed:
		case <-ctx.Done():
			if c, ok := p.q.cancel(w); ok {
				// Granted as the call gave up: the container is healthy.
				e.release(p, c, true, "")
			}
			return nil, ctxError(ctx, "waiting for a container")
		case <-e.closing:
			if c, ok := p.q.cancel(w); ok {
				e.release(p, c, true, "")
			}
			return nil, callErr(KindBusy, nil, "the engine is closing")
		case <-capTimer.C:
			if p.q.stats().Starting > 0 || e.launchOverTarget(p, w) {
				capTimer.Reset(e.cfg.MaxSlotWait)
				continue
			}
			if c, ok := p.q.cancel(w); ok {
				return c, nil
			}
			return nil, callErr(KindCapacityTimeout, nil, "no container of the function was free within %v, and none was starting", e.cfg.MaxSlotWait)
		}
	}
}

// fillLaunches starts the launches p's waiters need, as far as capacity
// allows; a launch that cannot reserve waits for the next signal.
func (e *Engine) fillLaunches(p *pool) {
	for p.q.claimLaunch() {
		res, err := e.reserve(p)
		if err != nil {
			p.q.unclaim()
			return
		}
		e.startLaunch(p, res, nil)
	}
}

// reserve reserves one container's resources for p, evicting idle
// containers of other pools if that makes them fit. It never waits for a
// busy container; failing is KindBusy.
func (e *Engine) reserve(p *pool) (*Reservation, error) {
	for range 3 {
		if r, ok := e.tracker.TryReserve(p.res); ok {
			return r, nil
		}
		victims := e.claimVictims(p, e.tracker.Shortfall(p.res))
		if len(victims) == 0 {
			break
		}
		var wg sync.WaitGroup
		for _, v := range victims {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e.log.Info("evicting idle function container", "container", v.name, "fn", v.pool.fn.ID, "for", p.fn.ID)
				e.destroy(v, "evicted for another function")
			}()
		}
		wg.Wait()
	}
	return nil, callErr(KindBusy, nil, "this node's capacity is taken (the function needs %v; %v is free) and no idle container of another function can make room",
		p.res, e.tracker.Free())
}

// claimVictims takes off their idle stacks the idle containers of other
// pools that planEviction chooses to free short.
func (e *Engine) claimVictims(p *pool, short Resources) []*hotContainer {
	e.mu.Lock()
	others := make([]*pool, 0, len(e.pools))
	for _, op := range e.pools {
		if op != p {
			others = append(others, op)
		}
	}
	e.mu.Unlock()
	type owned struct {
		pool *pool
		slot idleSlot[*hotContainer]
	}
	var cands []evictionCandidate
	var owners []owned
	for _, op := range others {
		for _, s := range op.q.idleSlots() {
			cands = append(cands, evictionCandidate{resources: op.res, idleSince: s.since})
			owners = append(owners, owned{op, s})
		}
	}
	var victims []*hotContainer
	for _, i := range planEviction(cands, short) {
		if o := owners[i]; o.pool.q.removeIdle(o.slot.slot, o.slot.seq) {
			victims = append(victims, o.slot.slot)
		}
	}
	return victims
}

// startLaunch launches a container for p in the background; it goes to
// target if target still waits, else to the longest waiter, else idle.
func (e *Engine) startLaunch(p *pool, res *Reservation, target *slotWaiter[*hotContainer]) {
	ok := e.goBackground(func() { e.runLaunch(p, res, target) })
	if !ok {
		res.Release()
		p.q.launchFailed(callErr(KindBusy, nil, "the engine is closing"), target)
	}
}

// runLaunch launches a container for p, claimed in its queue, and hands
// it out as startLaunch says; it returns when the container is handed out
// or its launch failed.
func (e *Engine) runLaunch(p *pool, res *Reservation, target *slotWaiter[*hotContainer]) {
	c, err := e.launch(p, res)
	if err != nil {
		e.log.Warn("function container launch failed", "fn", p.fn.ID, "err", err)
		// Released before the error is delivered, so a caller that
		// hears of the failure finds the capacity back.
		res.Release()
		p.q.launchFailed(err, target)
		e.signal()
		return
	}
	if idle, seq := p.q.launched(c, target); idle {
		e.becameIdle(c, seq)
	}
}

// dispatch sends the call to c and streams the answer to w, then returns c
// to its pool or replaces it.
//
// A container is kept only when it finished the call within the contract:
// it answered 200 and the engine read the body to its end, or it answered
// 502 (the FDK's word that the handler returned with an error). After any
// other ending (timeout, the caller gone, a response cut off for size, a
// broken connection, a status outside the contract) the handler may still
// be running or the FDK may be broken, so the container is removed and the
// next call gets a fresh one.
func (e *Engine) dispatch(ctx context.Context, p *pool, c *hotContainer, call CallRequest, length int64, w http.ResponseWriter, deadline time.Time, report *CallReport) error {
	fn := p.fn
	c.logs.setCall(e.logs.open(call.ID))
	var body io.Reader
	var limited *limitedBody
	if n, ok := inMemoryLen(call.Body); ok && n <= fn.MaxRequestBytes {
		// Within the limit as it is, and passed unwrapped: a body known
		// to be in memory is written together with the request's head in
		// the call's goroutine (package callconn), where any other body is
		// written beside the response's read by a goroutine of its own.
		body = call.Body
	} else if call.Body != nil {
		limited = &limitedBody{r: call.Body, left: fn.MaxRequestBytes}
		body = limited
	}
	resp, err := c.conn.RoundTrip(newContainerRequest(ctx, call, deadline, body, length))
	if err != nil {
		if limited != nil && limited.exceeded.Load() {
			e.release(p, c, false, "request too big")
			return callErr(KindRequestTooBig, nil, "the request body exceeds the function's %d bytes", fn.MaxRequestBytes)
		}
		cerr := e.broken(ctx, c, err, "before the container answered")
		e.release(p, c, false, cerr.Message)
		return cerr
	}
	// The body is closed before the container is released, so its
	// connection is back with its client (or closed) by the time another
	// call takes the container.
	defer resp.Body.Close()
	keep, reason, cerr, lost := relay(w, resp, fn.MaxResponseBytes, report)
	if lost != nil {
		cerr = e.broken(ctx, c, lost, "while streaming its response")
		cerr.Partial = true // the function's status is already on its way
		reason = cerr.Message
	}
	resp.Body.Close()
	e.release(p, c, keep, reason)
	if cerr != nil {
		return cerr
	}
	return nil
}

// relay applies the container contract to the container's answer and
// streams the function's response to w. keep says whether the container
// may serve another call and reason why not; cerr is the call's error
// (nil when the response reached w whole). lost is a failure of the
// container's connection while streaming, which only the engine can
// explain (the container may have died, see Engine.broken); relay then
// leaves cerr nil and reason "streaming". relay never panics on what a
// container sends: its input is outside the node's control (FuzzRelay).
func relay(w http.ResponseWriter, resp *http.Response, maxResponse int64, report *CallReport) (keep bool, reason string, cerr *CallError, lost error) {
	if kind, keep := containerStatus(resp.StatusCode); kind != "" {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return keep, "status " + strconv.Itoa(resp.StatusCode), callErr(kind, nil, "the container answered %d: %q", resp.StatusCode, snippet), nil
	}
	status, err := userStatus(resp.Header)
	if err != nil {
		return false, "invalid Fn-Http-Status", callErr(KindInvalidResponse, err, "%v", err), nil
	}
	if resp.ContentLength > maxResponse {
		return false, "response too big", callErr(KindResponseTooBig, nil, "the response body is %d bytes; the function may send %d", resp.ContentLength, maxResponse), nil
	}
	copyUserHeaders(w.Header(), resp.Header, gatewayCall(resp.Request))
	w.WriteHeader(status)

	n, err := stream(w, resp.Body, maxResponse)
	report.ResponseBytes = n
	var werr writeError
	switch {
	case err == nil:
		return true, "", nil, nil
	case errors.Is(err, errResponseTooBig):
		cerr = callErr(KindResponseTooBig, nil, "the response body exceeded the function's %d bytes", maxResponse)
	case errors.As(err, &werr):
		cerr = callErr(KindCanceled, werr.err, "writing the response to the caller: %v", werr.err)
	default:
		return false, "streaming", nil, err
	}
	cerr.Partial = true
	return false, cerr.Message, cerr, nil
}

var errResponseTooBig = errors.New("response too big")

// writeError is a failure to write to the caller's ResponseWriter.
type writeError struct{ err error }

func (w writeError) Error() string { return w.err.Error() }

// streamBuffers are stream's buffers: one per call in flight, reused,
// because a fresh 32 KiB per call was most of the garbage a call made.
var streamBuffers = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// stream copies the body to w as it arrives, flushing after every read,
// and fails before writing past limit.
func stream(w http.ResponseWriter, body io.Reader, limit int64) (int64, error) {
	flusher := http.NewResponseController(w)
	pooled := streamBuffers.Get().(*[32 << 10]byte)
	defer streamBuffers.Put(pooled)
	buf := pooled[:]
	var n int64
	for {
		m, rerr := body.Read(buf)
		if m > 0 {
			if n+int64(m) > limit {
				return n, errResponseTooBig
			}
			if _, err := w.Write(buf[:m]); err != nil {
				return n, writeError{err}
			}
			n += int64(m)
			_ = flusher.Flush()
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// broken explains a call whose connection failed: the call's context
// ended (timeout, canceled), or the container did: killed for memory,
// exited, or alive but answering outside the protocol.
func (e *Engine) broken(ctx context.Context, c *hotContainer, err error, phase string) *CallError {
	if ctx.Err() != nil {
		return ctxError(ctx, "while the function ran")
	}
	timer := time.NewTimer(2 * time.Second)
	select {
	case <-c.exited:
		timer.Stop()
		cerr := e.exitError(c, "during the call")
		if cerr.Kind != KindOutOfMemory {
			// It had started and taken the call: not an init failure,
			// whatever it served before.
			cerr.Kind = KindNoResponse
		}
		return cerr
	case <-timer.C:
	}
	return callErr(KindNoResponse, err, "the connection to container %s failed %s: %v", c.name, phase, err)
}

// release ends c's call: back to the pool if keep (and it still runs),
// else removed.
func (e *Engine) release(p *pool, c *hotContainer, keep bool, reason string) {
	if keep {
		select {
		case <-c.exited:
			keep, reason = false, "exited"
		default:
		}
	}
	if keep {
		if idle, seq := p.q.put(c); idle {
			e.becameIdle(c, seq)
		}
		return
	}
	p.q.retire()
	e.destroyAsync(c, reason)
	e.signal()
}

// Close stops taking calls, waits for those in flight until ctx ends,
// stops launches and pulls, and removes every container the engine
// started. It returns ctx's error if calls were still running.
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	close(e.closing)
	e.mu.Unlock()
	done := make(chan struct{})
	go func() {
		e.calls.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("fnagent: close with calls in flight: %w", ctx.Err())
	}
	e.cancel()
	e.bg.Wait()
	e.drainPool() // netnspool.go; nothing fills it any more
	e.mu.Lock()
	all := make([]*hotContainer, 0, len(e.containers))
	for c := range e.containers {
		all = append(all, c)
	}
	e.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.destroy(c, "engine closing")
		}()
	}
	wg.Wait()
	if !e.ownsClient {
		return err
	}
	if cerr := e.api.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("fnagent: crypto/rand: " + err.Error())
	}
	return hex.EncodeToString(b)
}
