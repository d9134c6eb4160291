package nodeagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"reflect"
	"sync"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/supervise"
	"github.com/mercator/mercator/nodeproto"
)

// Identity is the immutable material a machine was bootstrapped with. The
// agent never invents any of it.
type Identity struct {
	ControlPlaneURL string
	NodeID          string
	RentalID        string
	Generation      uint64
	// EnrollmentToken is the single-use invitation; it is spent on the first
	// enrollment and useless afterwards.
	EnrollmentToken string
	AgentVersion    string
}

// ErrReenrollRequired is returned by Run when the agent holds no usable
// session and its invitation cannot be spent (already spent, expired, or
// none given). The way back is a new invitation: `mercator node invite
// NODE_ID` on the control plane, then the agent restarted with it.
var ErrReenrollRequired = errors.New("this agent needs a new invitation")

// Agent runs one machine's side of the node protocol.
type Agent struct {
	labels    map[string]string // reported with the facts (labels.go)
	identity  Identity
	runtime   Runtime
	transport Transport
	state     *State
	logger    *slog.Logger
	now       func() time.Time

	heartbeat    time.Duration
	observeEvery time.Duration
	backoff      time.Duration
	// preparingAfter and flushLinger: see their defaults,
	// defaultPreparingAfter and defaultFlushLinger.
	preparingAfter time.Duration
	flushLinger    time.Duration

	flush     chan struct{}
	observeCh chan struct{}
	// factsCh wakes the facts loop early (after a GPU sample, gpus.go);
	// gpuSampleEvery is that sample's period.
	factsCh        chan struct{}
	gpuSampleEvery time.Duration
	// The GPU diagnostic's period and the kept GPU inventory (gpus.go).
	gpuDiagEvery time.Duration
	gpuDiagSet   bool
	forgetGPUs   bool
	savedGPUs    []nodeproto.Accelerator

	mu       sync.Mutex
	keyLocks map[string]*sync.Mutex
	shipping map[nodeproto.WorkloadKey]chan struct{}
	shipped  map[nodeproto.WorkloadKey]bool
	fatal    chan error

	functions *agentFunctions // nil without WithFunctions; see functions.go
	tls       *tls.Config     // nil without WithTLS; see transport.go
	cpClient  *http.Client    // controlPlaneClient's, made once in New
	upgrader  Upgrader        // nil without WithUpgrader
}

// Upgrader carries out upgrade_agent commands (package agentupgrade). Upgrade
// returns nil when the agent already runs the release, an error when the
// release was refused or the upgrade rolled back, and otherwise does not
// return: the process is replaced.
type Upgrader interface {
	Upgrade(ctx context.Context, operationID string, c nodeproto.UpgradeAgentCommand) error
}

// WithUpgrader lets the agent upgrade itself.
func WithUpgrader(u Upgrader) Option { return func(a *Agent) { a.upgrader = u } }

// Option configures an Agent.
type Option func(*Agent)

// WithHeartbeat sets how often the agent reports its liveness and facts. It
// must stay well inside the control plane's lease, or a healthy machine will
// be declared lost; the agent also never waits longer than a third of the
// lease the control plane stated at enrollment.
func WithHeartbeat(d time.Duration) Option { return func(a *Agent) { a.heartbeat = d } }

// WithLogger replaces the agent's logger.
func WithLogger(l *slog.Logger) Option { return func(a *Agent) { a.logger = l } }

// WithReconnectBackoff sets how long the agent waits before reopening a
// dropped session; it doubles on repeated failures up to 16 times this.
func WithReconnectBackoff(d time.Duration) Option { return func(a *Agent) { a.backoff = d } }

// WithObserveInterval sets how often the agent reads the daemon's view of its
// workloads. Every launch and stop also triggers a read at once.
func WithObserveInterval(d time.Duration) Option { return func(a *Agent) { a.observeEvery = d } }

// WithClock injects the clock, for tests.
func WithClock(now func() time.Time) Option { return func(a *Agent) { a.now = now } }

// New returns an agent for one machine. It does nothing until Run.
func New(identity Identity, runtime Runtime, transport Transport, state *State, options ...Option) *Agent {
	a := &Agent{
		identity: identity, runtime: runtime, transport: transport, state: state,
		logger: slog.Default(), now: time.Now,
		heartbeat: 5 * time.Second, observeEvery: time.Second, backoff: 500 * time.Millisecond,
		preparingAfter: defaultPreparingAfter, flushLinger: defaultFlushLinger,
		flush: make(chan struct{}, 1), observeCh: make(chan struct{}, 1), factsCh: make(chan struct{}, 1),
		keyLocks: map[string]*sync.Mutex{},
		shipping: map[nodeproto.WorkloadKey]chan struct{}{}, shipped: map[nodeproto.WorkloadKey]bool{},
		fatal: make(chan error, 1),
	}
	for _, o := range options {
		o(a)
	}
	if a.functions != nil && a.tls != nil {
		a.functions.client.Transport.(*http.Transport).TLSClientConfig = a.tls
	}
	a.cpClient = a.newControlPlaneClient()
	return a
}

// Run connects to the control plane and serves until ctx ends or the agent
// can no longer act for this node: its fencing token was superseded
// (failure.ErrFenced) or it holds no valid session and cannot enroll
// (ErrReenrollRequired). Network failures are retried with backoff, never
// returned.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.ensureSession(ctx); err != nil {
		return err
	}
	a.restoreGPUs() // after an enrollment, which starts the inventory afresh
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	// Each loop runs supervised (package supervise): a panic in one is
	// logged with its stack and the loop restarted after a backoff, rather
	// than ending the agent and every workload's reporting with it.
	sup := supervise.Supervisor{Log: a.logger}
	for _, l := range []struct {
		name string
		loop func(context.Context)
	}{{"session", a.sessionLoop}, {"observe", a.observeLoop}, {"flush", a.flushLoop}, {"heartbeat", a.heartbeatLoop}, {"facts", a.factsLoop}, {"renew", a.renewLoop}, {"gpus", a.gpuLoop}, {"gpudiag", a.gpuDiagLoop}} {
		wg.Add(1)
		go func() { defer wg.Done(); sup.Run(ctx, l.name, l.loop) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-a.fatal:
	}
	cancel()
	wg.Wait()
	return err
}

func (a *Agent) stop(err error) {
	select {
	case a.fatal <- err:
	default:
	}
}

// ensureSession resumes the stored session when it is still valid, and
// otherwise spends the invitation.
func (a *Agent) ensureSession(ctx context.Context) error {
	if stored := a.state.NodeID(); stored != "" && stored != a.identity.NodeID {
		return fmt.Errorf("the state directory belongs to node %q, not %q: give each node its own --state directory", stored, a.identity.NodeID)
	}
	if _, exp, ok := a.state.Session(); ok && exp.After(a.now()) {
		a.logger.Info("resuming session", "node", a.identity.NodeID, "expires", exp, "fencing_token", a.state.FencingToken())
		return nil
	}
	if a.identity.EnrollmentToken == "" {
		return fmt.Errorf("%w: no valid session is stored and no invitation was given; run `mercator node invite %s` on the control plane and start the agent with the token it prints", ErrReenrollRequired, a.identity.NodeID)
	}
	backoff := a.backoff
	for {
		enr, err := a.transport.Enroll(ctx, nodeproto.EnrollmentRequest{
			NodeID: a.identity.NodeID, Invitation: a.identity.EnrollmentToken,
			AgentVersion: a.identity.AgentVersion, CapabilityVersion: nodeproto.Version,
		})
		if err == nil {
			if err := a.state.Enrolled(a.identity.NodeID, enr); err != nil {
				return err
			}
			a.logger.Info("enrolled", "node", a.identity.NodeID, "fencing_token", enr.FencingToken, "expires", enr.ExpiresAt)
			a.adoptLease(enr.Lease)
			return nil
		}
		if !errors.Is(err, failure.ErrUnavailable) {
			return fmt.Errorf("%w: enrollment refused: %v; run `mercator node invite %s` on the control plane and restart the agent with the new token", ErrReenrollRequired, err, a.identity.NodeID)
		}
		a.logger.Warn("control plane unreachable; retrying enrollment", "err", err, "in", backoff)
		if !sleep(ctx, backoff) {
			return ctx.Err()
		}
		backoff = min(backoff*2, 16*a.backoff)
	}
}

func (a *Agent) adoptLease(lease time.Duration) {
	if lease > 0 && a.heartbeat > lease/3 {
		a.heartbeat = lease / 3
	}
}

func (a *Agent) creds() (string, string) {
	tok, _, _ := a.state.Session()
	return a.identity.NodeID, tok
}

// handleTransportError decides whether an error ends the agent. Fencing and
// a refused credential do; everything else is retried.
func (a *Agent) handleTransportError(what string, err error) {
	switch {
	case errors.Is(err, failure.ErrFenced):
		// The control plane's message says why: a later enrollment of this
		// node, or `mercator node rm` (which names itself).
		a.logger.Error("fenced by the control plane; stopping", "during", what, "err", err)
		a.stop(fmt.Errorf("%s: %w", what, err))
	case errors.Is(err, failure.ErrUnauthorized):
		a.logger.Error("session credential refused", "during", what, "err", err)
		_ = a.state.ForgetSession()
		a.stop(fmt.Errorf("%w: %s: %v; run `mercator node invite %s` and restart the agent with the new token", ErrReenrollRequired, what, err, a.identity.NodeID))
	default:
		a.logger.Warn("control plane call failed; will retry", "during", what, "err", err)
	}
}

func (a *Agent) sessionLoop(ctx context.Context) {
	backoff := a.backoff
	for ctx.Err() == nil {
		commands := make(chan nodeproto.Command)
		done := make(chan error, 1)
		nodeID, tok := a.creds()
		started := a.now()
		go func() { done <- a.transport.Session(ctx, nodeID, tok, commands) }()
		a.wakeObserve() // a fresh session is a good moment to say what runs here
	loop:
		for {
			select {
			case cmd := <-commands:
				a.dispatch(ctx, cmd) // commands.go
			case err := <-done:
				if ctx.Err() != nil {
					return
				}
				a.handleTransportError("session", err)
				break loop
			}
		}
		if a.now().Sub(started) > 10*a.backoff {
			backoff = a.backoff
		}
		// Jittered: when a control-plane replica dies, every node that
		// held a session there reconnects, and without jitter they would
		// all arrive at the surviving replicas in the same instant, at
		// every step of the backoff.
		if !sleep(ctx, jitter(backoff)) {
			return
		}
		backoff = min(backoff*2, 16*a.backoff)
	}
}

// defaultFlushLinger is how long the agent waits, once woken to deliver an
// event, before reading the spool: a launch's result and the running
// observation it causes are spooled a moment apart, and one delivery
// carrying both costs the node and the control plane half what two do.
const defaultFlushLinger = 10 * time.Millisecond

// flushRetry is how soon a delivery that failed, or left events behind, is
// tried again; flushIdle how often the loop looks anyway while nothing is
// owed (every spool wakes it; this is the safety net, and when
// acknowledgements waiting to be written are written, ackLinger).
const (
	flushRetry = time.Second
	flushIdle  = ackLinger
)

// flushLoop delivers the spool in minting order whenever something is owed:
// when woken (after flushLinger), and again flushRetry after a delivery
// that did not take everything. An idle agent wakes only every flushIdle:
// at ten thousand agents a wake every second each was ten thousand a
// second for nothing.
func (a *Agent) flushLoop(ctx context.Context) {
	t := time.NewTimer(flushIdle)
	defer t.Stop()
	// emptyAt is the spool's version when it was last read empty: a tick
	// finding the same version has nothing to read.
	emptyAt := ^uint64(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := a.state.FlushAcknowledged(); err != nil {
				a.logger.Error("write acknowledgements", "err", err)
			}
			if a.state.SpoolVersion() == emptyAt {
				t.Reset(flushIdle)
				continue
			}
		case <-a.flush:
			if !sleep(ctx, a.flushLinger) {
				return
			}
		}
		next := flushIdle
		for ctx.Err() == nil {
			version := a.state.SpoolVersion()
			batch, err := a.state.Spooled(256)
			if err != nil {
				a.logger.Error("read spool", "err", err)
				next = flushRetry
				break
			}
			if len(batch) == 0 {
				emptyAt = version
				break
			}
			nodeID, tok := a.creds()
			var accepted []string
			if ts, ok := a.transport.(ThroughSender); ok {
				accepted, err = ts.SendEventsThrough(ctx, nodeID, tok, batch, a.state.Through())
			} else {
				accepted, err = a.transport.SendEvents(ctx, nodeID, tok, batch)
			}
			if err != nil {
				if ctx.Err() == nil {
					a.handleTransportError("events", err)
				}
				next = flushRetry
				break
			}
			if err := a.state.Acknowledge(accepted); err != nil {
				a.logger.Error("acknowledge spool", "err", err)
				next = flushRetry
				break
			}
			if len(accepted) < len(batch) {
				next = flushRetry // the rest is retried then
				break
			}
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

// heartbeatLoop reports liveness on every tick. It never waits for
// anything but the control plane: facts are read in factsLoop, because a
// vendor tool that hangs (nvidia-smi on a wedged driver can take its full
// timeout) must not make a healthy machine miss its lease.
//
// A heartbeat that failed is tried again after the reconnect backoff
// (jittered, doubling up to the heartbeat period), not a whole period
// later: the lease allows three periods, and when every node reconnects at
// once (a control plane restarted, a network blip) a node whose first
// attempt met a full server had then only one more before its lease
// lapsed.
func (a *Agent) heartbeatLoop(ctx context.Context) {
	retry := a.backoff
	for {
		nodeID, tok := a.creds()
		wait := a.heartbeat
		if _, err := a.transport.SendEvents(ctx, nodeID, tok, nil); err != nil && ctx.Err() == nil {
			a.handleTransportError("heartbeat", err)
			wait, retry = min(jitter(retry), a.heartbeat), min(retry*2, a.heartbeat)
		} else {
			retry = a.backoff
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}

// factsLoop reads the node's facts once per heartbeat period (and after each
// GPU sample) and spools them when they changed since they were last
// reported.
func (a *Agent) factsLoop(ctx context.Context) {
	var last *nodeproto.NodeFacts
	for {
		facts, err := a.runtime.Facts(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			a.logger.Warn("read facts", "err", err)
		} else {
			facts.AgentVersion = a.identity.AgentVersion
			facts.CapabilityVersion = nodeproto.Version
			facts.Functions = a.functionFacts()
			facts.Labels = a.labels // labels.go
			facts.NoSelfUpgrade = a.upgrader == nil
			a.keepGPUs(facts.Accelerators)
			if last == nil || !reflect.DeepEqual(*last, facts) {
				if id, err := a.state.NextEventID(); err == nil {
					if err := a.state.Spool(nodeproto.Event{ID: id, Kind: nodeproto.EventFacts, At: a.now().UTC(), Facts: &facts}); err == nil {
						last = &facts
						a.wakeFlush()
					}
				}
			}
		}
		if !sleepOrWake(ctx, a.heartbeat, a.factsCh) {
			return
		}
	}
}

// renewLoop renews the session credential once two thirds of its life has
// passed, persisting the new one before using it.
func (a *Agent) renewLoop(ctx context.Context) {
	for {
		_, exp, ok := a.state.Session()
		if !ok {
			return
		}
		wait := exp.Sub(a.now()) * 2 / 3
		if wait > time.Minute {
			wait = exp.Sub(a.now()) - max(time.Minute, exp.Sub(a.now())/3)
		}
		if wait > 0 && !sleep(ctx, wait) {
			return
		}
		nodeID, tok := a.creds()
		r, err := a.transport.RenewSession(ctx, nodeID, tok)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			a.handleTransportError("renew", err)
			if !sleep(ctx, a.backoff) {
				return
			}
			continue
		}
		if err := a.state.Renewed(r); err != nil {
			a.logger.Error("persist renewed credential; keeping the old one", "err", err)
			continue
		}
		a.logger.Info("session renewed", "expires", r.ExpiresAt)
	}
}

// jitter returns a duration drawn uniformly from [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// sleepOrWake is sleep that also ends early at a signal on wake.
func sleepOrWake(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-wake:
	}
	return true
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
