package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"sync"
	"time"

	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/node"
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

	mu       sync.Mutex
	keyLocks map[string]*sync.Mutex
	shipping map[capability.WorkloadKey]chan struct{}
	shipped  map[capability.WorkloadKey]bool
	fatal    chan error

	functions *agentFunctions // nil without WithFunctions; see functions.go
}

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
		flush: make(chan struct{}, 1), observeCh: make(chan struct{}, 1),
		keyLocks: map[string]*sync.Mutex{},
		shipping: map[capability.WorkloadKey]chan struct{}{}, shipped: map[capability.WorkloadKey]bool{},
		fatal: make(chan error, 1),
	}
	for _, o := range options {
		o(a)
	}
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, loop := range []func(context.Context){a.sessionLoop, a.observeLoop, a.flushLoop, a.heartbeatLoop, a.factsLoop, a.renewLoop} {
		wg.Add(1)
		go func() { defer wg.Done(); loop(ctx) }()
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
		enr, err := a.transport.Enroll(ctx, capability.EnrollmentRequest{
			NodeID: a.identity.NodeID, Invitation: a.identity.EnrollmentToken,
			AgentVersion: a.identity.AgentVersion, CapabilityVersion: capability.Version,
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
		a.logger.Error("superseded by a later enrollment of this node; stopping", "during", what, "err", err)
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
		commands := make(chan node.Command)
		done := make(chan error, 1)
		nodeID, tok := a.creds()
		started := a.now()
		go func() { done <- a.transport.Session(ctx, nodeID, tok, commands) }()
		a.wakeObserve() // a fresh session is a good moment to say what runs here
	loop:
		for {
			select {
			case cmd := <-commands:
				if cmd.Kind == node.KindInvoke {
					a.invoke(ctx, cmd) // hands the call to a worker (functions.go)
					continue
				}
				go a.handle(ctx, cmd)
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

// lockKey serializes operations on one workload (a launch and its stop) while
// letting different workloads proceed in parallel.
func (a *Agent) lockKey(key string) func() {
	a.mu.Lock()
	l, ok := a.keyLocks[key]
	if !ok {
		l = &sync.Mutex{}
		a.keyLocks[key] = l
	}
	a.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func commandKey(cmd node.Command) string {
	switch {
	case cmd.LaunchWorkload != nil:
		return fmt.Sprintf("w/%s/%d", cmd.LaunchWorkload.RunID, cmd.LaunchWorkload.Attempt)
	case cmd.StopWorkload != nil:
		return fmt.Sprintf("w/%s/%d", cmd.StopWorkload.RunID, cmd.StopWorkload.Attempt)
	}
	return "op/" + cmd.OperationID
}

// handle applies one command at most once. Invoke commands go to invoke
// instead (functions.go): they are not operations.
func (a *Agent) handle(ctx context.Context, cmd node.Command) {
	if cmd.Kind == node.KindCallLog {
		a.answerCallLog(ctx, cmd) // ephemeral too (functions_logs.go)
		return
	}
	unlock := a.lockKey(commandKey(cmd))
	defer unlock()
	if ev, ok := a.state.AppliedResult(cmd.OperationID); ok {
		// Redelivered: answer with the very same event.
		if err := a.state.Spool(ev); err != nil {
			a.logger.Error("re-spool result", "op", cmd.OperationID, "err", err)
		}
		a.wakeFlush()
		return
	}
	result := node.Result{OperationID: cmd.OperationID, FencingToken: cmd.FencingToken, Kind: cmd.Kind}
	if held := a.state.FencingToken(); cmd.FencingToken < held {
		result.Outcome = node.OutcomeRefused
		result.Error = fmt.Sprintf("command fenced at token %d, below this node's token %d: it was issued to an enrollment that has been superseded", cmd.FencingToken, held)
	} else if err := a.applyRetrying(ctx, cmd, &result); err != nil {
		if ctx.Err() != nil {
			return // shutting down: the command will be redelivered
		}
		result.Outcome = node.OutcomeFailed
		result.Error = err.Error()
	} else {
		result.Outcome = node.OutcomeOK
	}
	result.At = a.now().UTC()
	id, err := a.state.NextEventID()
	if err != nil {
		a.logger.Error("mint event ID", "err", err)
		return
	}
	if err := a.state.MarkApplied(cmd.OperationID, node.Event{ID: id, Kind: node.EventResult, At: result.At, Result: &result}); err != nil {
		a.logger.Error("record applied operation", "op", cmd.OperationID, "err", err)
		return
	}
	a.logger.Info("applied", "op", cmd.OperationID, "kind", cmd.Kind, "outcome", result.Outcome, "error", result.Error)
	a.wakeObserve()
	a.wakeFlush()
}

// unavailableRetry bounds how long an operation is retried while the
// container runtime is unreachable (a daemon restart takes seconds). Past it,
// the failure is reported: a machine whose daemon stays down cannot do the
// work, and the run's retry policy decides what happens next.
const unavailableRetry = time.Minute

// applyRetrying applies a command, retrying while the failure is
// failure.ErrUnavailable (the daemon restarting, a registry briefly
// unreachable) rather than reporting a transient outage as the run's
// failure. Operations are idempotent on the runtime side (a launch adopts the
// container a previous try created), so retrying is safe.
func (a *Agent) applyRetrying(ctx context.Context, cmd node.Command, result *node.Result) error {
	deadline := a.now().Add(unavailableRetry)
	backoff := 250 * time.Millisecond
	for {
		err := a.apply(ctx, cmd, result)
		if err == nil || !errors.Is(err, failure.ErrUnavailable) || !a.now().Before(deadline) {
			return err
		}
		a.logger.Warn("runtime unavailable; retrying operation", "op", cmd.OperationID, "kind", cmd.Kind, "err", err, "in", backoff)
		if !sleep(ctx, backoff) {
			return ctx.Err()
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (a *Agent) apply(ctx context.Context, cmd node.Command, result *node.Result) error {
	switch cmd.Kind {
	case node.KindPrepareImage:
		if cmd.PrepareImage == nil {
			return failure.Invalid("prepare_image", "command carries no payload")
		}
		return a.runtime.PrepareImage(ctx, *cmd.PrepareImage)
	case node.KindPrepareArtifact:
		if cmd.PrepareArtifact == nil {
			return failure.Invalid("prepare_artifact", "command carries no payload")
		}
		return a.runtime.PrepareArtifact(ctx, *cmd.PrepareArtifact)
	case node.KindLaunchWorkload:
		l := cmd.LaunchWorkload
		if l == nil {
			return failure.Invalid("launch_workload", "command carries no payload")
		}
		result.Workload = &l.WorkloadKey
		defer a.reportPreparingAfter(capability.WorkloadObservation{WorkloadKey: l.WorkloadKey, Image: l.Image, Phase: capability.PhasePreparing, Timeout: l.Timeout})()
		if err := a.runtime.PrepareImage(ctx, capability.PrepareImageCommand{Image: l.Image, RegistryAuth: l.RegistryAuth}); err != nil {
			return fmt.Errorf("prepare image: %w", err)
		}
		return a.runtime.LaunchWorkload(ctx, *l)
	case node.KindStopWorkload:
		s := cmd.StopWorkload
		if s == nil {
			return failure.Invalid("stop_workload", "command carries no payload")
		}
		result.Workload = &s.WorkloadKey
		if s.Reason != "" {
			if err := a.state.RecordStop(s.WorkloadKey, s.Reason); err != nil {
				return err
			}
		}
		return a.runtime.StopWorkload(ctx, *s)
	}
	return failure.Invalid("kind", "unknown command kind %q (this agent speaks capability version %d)", cmd.Kind, capability.Version)
}

// defaultPreparingAfter is how long a launch runs before the agent reports
// its workload as preparing. A launch whose image is already on the machine
// ends well within it, and is then reported once, by its result and the
// running observation that follows, in one delivery; a launch that pulls
// shows up as preparing while it does. Reporting every launch as preparing
// up front cost the node a durable write and a delivery per run, and the
// control plane a transaction, for a state that usually lasted 100 ms.
const defaultPreparingAfter = time.Second

// reportPreparingAfter reports o (a preparing observation) once the launch
// has taken preparingAfter, unless the workload was reported on meanwhile.
// The returned func cancels the report, or waits for one under way, so a
// result spooled after it is spooled after the preparing report too.
func (a *Agent) reportPreparingAfter(o capability.WorkloadObservation) (cancel func()) {
	done := make(chan struct{})
	t := time.AfterFunc(a.preparingAfter, func() {
		defer close(done)
		a.spoolObservation(o, true)
	})
	return func() {
		if !t.Stop() {
			<-done
		}
	}
}

// spoolWorkload owes the control plane an observation if it says something
// new.
func (a *Agent) spoolWorkload(o capability.WorkloadObservation) {
	a.spoolObservation(o, false)
}

// spoolObservation spools o if it says something new, or, when onlyFirst,
// only if nothing at all was reported about its workload yet.
func (a *Agent) spoolObservation(o capability.WorkloadObservation, onlyFirst bool) {
	if !a.state.WorkloadChanged(o) {
		return
	}
	id, err := a.state.NextEventID()
	if err != nil {
		a.logger.Error("mint event ID", "err", err)
		return
	}
	spooled, err := a.state.SpoolWorkload(node.Event{ID: id, Kind: node.EventWorkload, At: a.now().UTC(), Workload: &o}, o, onlyFirst)
	if err != nil {
		a.logger.Error("spool observation", "err", err)
		return
	}
	if spooled {
		a.wakeFlush()
	}
}

func (a *Agent) wakeFlush() {
	select {
	case a.flush <- struct{}{}:
	default:
	}
}

func (a *Agent) wakeObserve() {
	select {
	case a.observeCh <- struct{}{}:
	default:
	}
}

// observeLoop reads the daemon's view and spools what changed. It runs even
// while the control plane is unreachable: that is how a container that exits
// during a partition is reported afterwards with the daemon's own moments.
func (a *Agent) observeLoop(ctx context.Context) {
	t := time.NewTicker(a.observeEvery)
	defer t.Stop()
	var changes <-chan struct{}
	if src, ok := a.runtime.(ChangeSource); ok {
		changes = src.Changes(ctx)
	}
	for {
		a.observeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.observeCh:
		case <-changes:
		}
	}
}

func (a *Agent) observeOnce(ctx context.Context) {
	obs, err := a.runtime.Observe(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.logger.Warn("observe runtime", "err", err)
		}
		return
	}
	seen := map[capability.WorkloadKey]bool{}
	for _, o := range obs {
		seen[o.WorkloadKey] = true
		o.StopReason = a.state.StopReason(o.WorkloadKey)
		if o.Phase == capability.PhaseRunning && o.Timeout > 0 && o.StartedAt != nil && !a.now().Before(o.StartedAt.Add(o.Timeout)) && o.StopReason == "" {
			a.enforceTimeout(ctx, o)
		}
		shipped := a.shipLogs(ctx, o)
		if o.Phase == capability.PhaseExited && shipped != nil && a.state.WorkloadChanged(o) {
			// Report the exit after the output it produced, so a client that
			// reads the logs of an ended run reads them whole. The wait is
			// bounded: a control plane that cannot take logs must not delay
			// the exit's report.
			select {
			case <-shipped:
			case <-time.After(5 * time.Second):
			case <-ctx.Done():
				return
			}
		}
		a.spoolWorkload(o)
	}
	// A workload the control plane was told about that the daemon no longer
	// knows: say so once, unless its end was already reported.
	for _, told := range a.state.Told() {
		if seen[told.WorkloadKey] || told.Phase == capability.PhasePreparing {
			continue
		}
		if told.Phase == capability.PhaseExited || told.Phase == capability.PhaseMissing || told.Phase == capability.PhaseFailed {
			continue
		}
		a.spoolWorkload(capability.WorkloadObservation{WorkloadKey: told.WorkloadKey, ContainerID: told.ContainerID, Phase: capability.PhaseMissing,
			Error: "the container is gone from the daemon without a recorded exit (removed by hand, or the daemon lost it)"})
	}
}

func (a *Agent) enforceTimeout(ctx context.Context, o capability.WorkloadObservation) {
	if err := a.state.RecordStop(o.WorkloadKey, "timeout"); err != nil {
		a.logger.Error("record timeout", "err", err)
		return
	}
	a.logger.Info("timeout reached; stopping", "run", o.RunID, "attempt", o.Attempt, "timeout", o.Timeout)
	go func() {
		unlock := a.lockKey(fmt.Sprintf("w/%s/%d", o.RunID, o.Attempt))
		defer unlock()
		if err := a.runtime.StopWorkload(ctx, capability.StopWorkloadCommand{WorkloadKey: o.WorkloadKey, Reason: "timeout", GracePeriod: 10 * time.Second}); err != nil {
			a.logger.Warn("stop timed-out workload", "err", err)
		}
		a.wakeObserve()
	}()
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
			accepted, err := a.transport.SendEvents(ctx, nodeID, tok, batch)
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
func (a *Agent) heartbeatLoop(ctx context.Context) {
	for {
		nodeID, tok := a.creds()
		if _, err := a.transport.SendEvents(ctx, nodeID, tok, nil); err != nil && ctx.Err() == nil {
			a.handleTransportError("heartbeat", err)
		}
		if !sleep(ctx, a.heartbeat) {
			return
		}
	}
}

// factsLoop reads the node's facts once per heartbeat period and spools them
// when they changed since they were last reported.
func (a *Agent) factsLoop(ctx context.Context) {
	var last *capability.NodeFacts
	for {
		facts, err := a.runtime.Facts(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			a.logger.Warn("read facts", "err", err)
		} else {
			facts.AgentVersion = a.identity.AgentVersion
			facts.CapabilityVersion = capability.Version
			facts.Functions = a.functionFacts()
			if last == nil || !reflect.DeepEqual(*last, facts) {
				if id, err := a.state.NextEventID(); err == nil {
					if err := a.state.Spool(node.Event{ID: id, Kind: node.EventFacts, At: a.now().UTC(), Facts: &facts}); err == nil {
						last = &facts
						a.wakeFlush()
					}
				}
			}
		}
		if !sleep(ctx, a.heartbeat) {
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

// shipLogs starts one shipper per workload whose output is not yet all
// delivered, and returns a channel closed when that shipper ends (nil when
// there is nothing to ship).
func (a *Agent) shipLogs(ctx context.Context, o capability.WorkloadObservation) <-chan struct{} {
	src, ok := a.runtime.(LogSource)
	if !ok || o.ContainerID == "" || (o.Phase != capability.PhaseRunning && o.Phase != capability.PhaseExited) {
		// A container not yet started has no output to follow (and the
		// daemon would end the stream at once, as if it had exited).
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.shipped[o.WorkloadKey] {
		return nil
	}
	if done, ok := a.shipping[o.WorkloadKey]; ok {
		return done
	}
	done := make(chan struct{})
	a.shipping[o.WorkloadKey] = done
	go func() {
		defer close(done)
		complete := a.shipLogsOnce(ctx, src, o.WorkloadKey)
		a.mu.Lock()
		delete(a.shipping, o.WorkloadKey)
		if complete {
			a.shipped[o.WorkloadKey] = true
		}
		a.mu.Unlock()
	}()
	return done
}

// shipLogsOnce streams a workload's output from the start, skipping what
// the control plane acknowledges holding. It returns true once the stream
// ended (the container exited) and everything was delivered; false means
// the next observation should try again.
func (a *Agent) shipLogsOnce(ctx context.Context, src LogSource, key capability.WorkloadKey) bool {
	rc, err := src.Logs(ctx, key, true)
	if err != nil {
		return false
	}
	defer rc.Close()
	var offset int64
	buf := make([]byte, 64<<10)
	for {
		n, rerr := io.ReadAtLeast(rc, buf, 1)
		if n > 0 {
			nodeID, tok := a.creds()
			ack, err := a.transport.SendLogs(ctx, nodeID, tok, capability.LogChunk{WorkloadKey: key, Offset: offset, Data: buf[:n]})
			if err != nil {
				return false
			}
			offset += int64(n)
			_ = ack // the control plane appends only what it lacks
		}
		if rerr != nil {
			return errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF)
		}
	}
}

// jitter returns a duration drawn uniformly from [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
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
