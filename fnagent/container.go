package fnagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/mercator/mercator/fnagent/internal/callconn"
	"github.com/mercator/mercator/fnagent/internal/fdksocket"
	"github.com/mercator/mercator/fnagent/outputrelay"
)

// One hot container's life: launched for a pool, paused when idle,
// resumed for a call, destroyed when it exits, breaks or is no longer
// wanted.

// hotContainer is one running function container.
type hotContainer struct {
	id, name string
	pool     *pool
	// holder is the network namespace holder the container joins
	// (netns.go), "" for none; set at create, removed with it.
	holder      string
	sockDir     string
	conn        *callconn.Client
	reservation *Reservation
	logs        *logSink
	// exited is closed when the attach stream ends: the process is gone.
	exited   chan struct{}
	attached bool
	attach   types.HijackedResponse
	served   atomic.Int64
	// pipes carry the container's output when it runs through the output
	// relay (outputrelay); nil when it does not.
	pipes    *outputrelay.Pipes
	launched LaunchTimes // set by launch before the container is handed out

	opMu   sync.Mutex // serializes pause and unpause
	paused bool       // guarded by opMu

	timerMu sync.Mutex
	timers  []*time.Timer

	stateMu sync.Mutex
	state   ContainerState
	gone    bool

	destroyOnce sync.Once
}

// launch pulls the image if need be, creates and starts a container, and
// waits for its socket. A container the pool has prepared (created and
// attached ahead, prepare.go) is started instead of checking the image and
// creating one. On
// failure the container is removed and the error says which step failed
// (KindImagePull…, KindInitFailed, KindInitTimeout, KindOutOfMemory).
func (e *Engine) launch(p *pool, res *Reservation) (*hotContainer, error) {
	fn := p.fn
	e.mu.Lock()
	auth := p.auth
	e.mu.Unlock()
	ctx := e.ctx
	var times LaunchTimes
	mark := e.now()
	lap := func(d *time.Duration) {
		now := e.now()
		*d, mark = now.Sub(mark), now
	}
	// A prepared container needs no image check: the daemon keeps an
	// image while a container uses it.
	c := e.takePrepared(p, res)
	if c == nil {
		c = e.awaitPrepared(p, res)
	}
	times.Prepared = c != nil
	if c == nil {
		if _, err := e.ensureImage(ctx, fn.Image, auth); err != nil {
			return nil, err
		}
		lap(&times.Image)
		var cerr *CallError
		if c, cerr = e.create(p, res, pooledNamespace); cerr != nil {
			return nil, cerr
		}
	}
	lap(&times.Create)
	fail := func(err *CallError) (*hotContainer, error) {
		e.destroy(c, err.Message)
		return nil, err
	}
	err := e.startContainer(ctx, c.id)
	if err != nil && c.holder != "" {
		// No launch fails for a holder (netns.go): one gone behind the
		// engine's back leaves its container unable to start, so a fresh
		// container, making its own namespace, is started instead.
		e.log.Debug("a container did not start in its holder's namespace; starting a fresh one",
			"container", c.name, "err", err)
		if c, err = e.replaceHeld(c); err != nil {
			return nil, err
		}
		err = e.startContainer(ctx, c.id)
	}
	if err != nil {
		return fail(callErr(KindInitFailed, err, "start container %s: %v", c.name, err))
	}
	lap(&times.Start)
	initCtx, cancel := context.WithTimeout(ctx, fn.InitTimeout)
	err = fdksocket.Wait(initCtx, c.sockDir, c.exited)
	cancel()
	lap(&times.Socket)
	switch {
	case err == nil:
	case errors.Is(err, fdksocket.ErrExited):
		return fail(e.exitError(c, "before it opened its socket"))
	case ctx.Err() != nil:
		return fail(callErr(KindBusy, err, "the engine is closing"))
	default:
		return fail(callErr(KindInitTimeout, err, "container %s did not accept a connection on %s within %v; its output ends: %q",
			c.name, fdksocket.Name, fn.InitTimeout, c.logs.Tail()))
	}
	c.conn = newCallConn(c.sockDir)
	c.launched = times
	// The next one, in the background (prepare.go): after this one is up,
	// so its create does not compete with this start at the daemon.
	e.prepare(p)
	e.log.Debug("function container ready", "container", c.name, "fn", fn.ID,
		"image", times.Image, "create", times.Create, "start", times.Start, "socket", times.Socket)
	return c, nil
}

// replaceHeld removes c, a container in a holder's namespace (a spare's,
// or a pooled one, netnspool.go) that a launch could not start, and
// creates another of its pool, making its own namespace, for the launch's
// reservation, which moves to it (not released by c's removal). The error
// is create's.
func (e *Engine) replaceHeld(c *hotContainer) (*hotContainer, error) {
	e.mu.Lock()
	res := c.reservation
	c.reservation = nil
	e.mu.Unlock()
	e.destroy(c, "it did not start in its network namespace holder's namespace")
	fresh, cerr := e.create(c.pool, res, ownNamespace)
	if cerr != nil {
		return nil, cerr
	}
	return fresh, nil
}

// create makes a container of p, created and attached but not started,
// holding res (nil for a container prepared ahead, which holds nothing
// until a launch takes it), in the network namespace mode says
// (netnspool.go): its own, or a pooled holder's, or one started for it
// (netns.go) when the engine can make one. On failure the container, and
// its holder, are removed.
func (e *Engine) create(p *pool, res *Reservation, mode holderMode) (*hotContainer, *CallError) {
	fn := p.fn
	ctx := e.ctx
	suffix := randomHex(8)
	c := &hotContainer{
		pool:        p,
		name:        containerName(fn.ID, suffix),
		sockDir:     filepath.Join(e.cfg.SocketRoot, suffix),
		reservation: res,
		logs:        newLogSink(e.logs),
		exited:      make(chan struct{}),
	}
	// Before the container counts as starting: a holder's start waits
	// out the launches' (netns.go).
	c.holder = e.holderFor(c.name, mode)
	e.register(c)
	fail := func(err *CallError) (*hotContainer, *CallError) {
		e.destroy(c, err.Message)
		return nil, err
	}
	if err := os.Mkdir(c.sockDir, 0o700); err != nil {
		return fail(callErr(KindInitFailed, err, "socket directory: %v", err))
	}
	// Whatever user the function runs as must be able to create its socket.
	if err := os.Chmod(c.sockDir, 0o777); err != nil {
		return fail(callErr(KindInitFailed, err, "socket directory: %v", err))
	}
	var gpus []string
	if res != nil {
		gpus = res.GPUs()
	}
	e.mu.Lock()
	auth := p.auth
	e.mu.Unlock()
	created, pipes, err := e.createContainer(c, p, gpus, auth)
	if err != nil {
		pipes.Close(0)
		var ce *CallError
		if errors.As(err, &ce) {
			return fail(ce)
		}
		return fail(callErr(KindInitFailed, err, "create container %s: %v", c.name, err))
	}
	c.id, c.pipes = created.ID, pipes
	if pipes != nil {
		pipes.Copy([2]io.Writer{c.logs.writer(0), c.logs.writer(1)})
	}
	// Attached before the start, so no output is lost; the stream ends when
	// the process does (or the container is removed unstarted), which is
	// how the engine learns of an exit. The pipes' copies end with it,
	// having read what the process wrote before it ended.
	attach, err := e.api.ContainerAttach(ctx, c.id, container.AttachOptions{Stream: true, Stdout: true, Stderr: true})
	if err != nil {
		pipes.Close(0)
		return fail(callErr(KindInitFailed, err, "attach to container %s: %v", c.name, err))
	}
	c.attach, c.attached = attach, true
	go func() {
		_, _ = stdcopy.StdCopy(c.logs.writer(0), c.logs.writer(1), attach.Reader)
		pipes.Close(pipeDrainGrace)
		close(c.exited)
	}()
	go func() {
		<-c.exited
		if p.q.removeIdle(c, 0) {
			e.destroyAsync(c, "exited while idle")
		}
	}()
	return c, nil
}

// pipeDrainGrace bounds how long after a container's exit the engine reads
// its output pipes: every process of a container ends with its first, so
// the pipes end at once unless the daemon is late to say so.
const pipeDrainGrace = 2 * time.Second

// createContainer asks the daemon for c's container, checking its image
// first (ensureImage; from memory unless the image is new to the engine),
// and again if the daemon no longer holds it (pulled again, and its
// command read again with it). When the engine relays fn's output
// (relays), the container runs the image's command through the relay, and
// the pipes made for it (outputrelay) are returned, the caller's to close
// whatever the error.
func (e *Engine) createContainer(c *hotContainer, p *pool, gpus []string, auth string) (created container.CreateResponse, pipes *outputrelay.Pipes, err error) {
	fn := p.fn
	ctx := e.ctx
	command, err := e.ensureImage(ctx, fn.Image, auth)
	if err != nil {
		return created, nil, err
	}
	relay := e.relays(fn, command)
	if relay {
		// Pipes that cannot be made (a socket root on a filesystem
		// without them) leave this container's output to the daemon,
		// never failing its launch.
		if pipes, err = e.makePipes(c.sockDir); err != nil {
			e.log.Warn("function output pipes not made; this container's output goes through the Docker daemon",
				"container", c.name, "err", err)
			relay = false
		}
	}
	create := func(command []string) (container.CreateResponse, error) {
		config, hostConfig := containerConfig(fn, p.key, c.sockDir, gpus, c.holder, relayCommand(relay, command), e.cfg)
		return e.api.ContainerCreate(ctx, config, hostConfig, nil, nil, c.name)
	}
	created, err = create(command)
	if err != nil && relay && strings.Contains(err.Error(), e.cfg.OutputRelay) {
		// The daemon cannot mount the relay (its machine does not have
		// the path): off for good, and this container made without it.
		if e.relayRefused.CompareAndSwap(false, true) {
			e.log.Warn("the Docker daemon cannot mount the function output relay; function output goes through the daemon from now on (--fn-output-relay)",
				"relay", e.cfg.OutputRelay, "err", err)
		}
		relay = false
		created, err = create(command)
	}
	if err == nil || !cerrdefs.IsNotFound(err) {
		return created, pipes, err
	}
	// The image was removed since ensureImage remembered it. Unused pipes,
	// should it no longer state a command, end with the container's attach
	// stream as used ones do.
	e.forgetImage(fn.Image)
	if command, err = e.ensureImage(ctx, fn.Image, auth); err != nil {
		return created, pipes, err
	}
	relay = relay && len(command) > 0
	created, err = create(command)
	return created, pipes, err
}

// relays reports whether fn's containers run through the engine's output
// relay: when the engine has one that the daemon has not refused, the
// image states a command for it to run, and the function's memory limit
// leaves room for the relay's start (the mercator binary's Go runtime,
// before it executes the command; no limit leaves room).
func (e *Engine) relays(fn FunctionConfig, command []string) bool {
	return e.cfg.OutputRelay != "" && !e.relayRefused.Load() && len(command) > 0 && (fn.MemoryMB == 0 || fn.MemoryMB >= minRelayMemoryMB)
}

// minRelayMemoryMB is the least memory limit under which a function's
// containers run through the output relay. The relay ran in a 6 MiB
// container (Docker's least) where the agent had already read the binary;
// the margin is for a machine where it had not, as the container that
// first reads a page of the binary is charged for it.
const minRelayMemoryMB = 32

// relayCommand is the command the engine gives a container: the image's
// run through the relay when relay is set, nil (the image's own) when not.
func relayCommand(relay bool, command []string) []string {
	if !relay {
		return nil
	}
	return outputrelay.Entrypoint(fdksocket.DirInContainer, command)
}

// exitError explains a container that exited: killed for memory, or exited
// with a code, with the end of its output.
func (e *Engine) exitError(c *hotContainer, when string) *CallError {
	info, err := e.inspectExited(c)
	if err != nil {
		return callErr(KindInitFailed, err, "container %s exited %s (inspect: %v); its output ends: %q", c.name, when, err, c.logs.Tail())
	}
	if info.State.OOMKilled {
		return callErr(KindOutOfMemory, nil, "container %s exceeded its %d MB memory limit and was killed %s", c.name, c.pool.fn.MemoryMB, when)
	}
	kind := KindInitFailed
	if c.served.Load() > 0 {
		kind = KindFunctionFailed
	}
	return callErr(kind, nil, "container %s exited with code %d %s; its output ends: %q", c.name, info.State.ExitCode, when, c.logs.Tail())
}

// inspectExited inspects a container expected to have exited, giving the
// daemon a moment to record the exit and, after an OOM kill, the flag that
// says so: the daemon handles containerd's OOM event apart from the exit,
// and on a loaded machine the flag has come more than a second after the
// exit (a CI run of TestOutOfMemory), so an exit by SIGKILL (137) without
// it is asked about for up to three seconds before it is taken as a plain
// kill. Only such exits wait: a kill by anyone else is rare, and calling
// an OOM kill a crash tells the user the wrong thing to fix.
func (e *Engine) inspectExited(c *hotContainer) (container.InspectResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var info container.InspectResponse
	var err error
	const tries = 60 // 50 ms apart
	for i := 0; i < tries; i++ {
		info, err = e.api.ContainerInspect(ctx, c.id)
		if err != nil {
			return info, err
		}
		if info.State == nil {
			return info, errors.New("the daemon states no container state")
		}
		if !info.State.Running && (info.State.OOMKilled || info.State.ExitCode != 137 || i == tries-1) {
			return info, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return info, nil
}

func (e *Engine) register(c *hotContainer) {
	e.mu.Lock()
	e.containers[c] = struct{}{}
	c.pool.live++
	e.mu.Unlock()
	e.setState(c, ContainerStarting)
}

func (e *Engine) setState(c *hotContainer, s ContainerState) {
	c.stateMu.Lock()
	from := c.state
	if c.gone || from == s || from == ContainerRemoving && s != ContainerNone {
		c.stateMu.Unlock()
		return
	}
	c.state = s
	c.gone = s == ContainerNone
	c.stateMu.Unlock()
	if e.metrics != nil {
		e.metrics.ContainerStateChanged(from, s)
	}
}

// becameIdle arms the idle container's pause and removal timers. A call
// may have taken it again already (put hands it over under the queue's
// lock); holding opMu and checking the idle period keeps that call's
// resume and this from undoing each other.
func (e *Engine) becameIdle(c *hotContainer, seq uint64) {
	c.opMu.Lock()
	defer func() {
		c.opMu.Unlock()
		e.signal()
	}()
	if !c.pool.q.isIdle(c, seq) {
		return
	}
	e.setState(c, ContainerIdle)
	idle := c.pool.fn.IdleTimeout
	var expire func()
	expire = func() {
		// A held pool keeps its minimum past the idle timeout (Hold).
		if e.keepWarm(c.pool) && c.pool.q.isIdle(c, seq) {
			c.setTimers([]*time.Timer{time.AfterFunc(idle, expire)})
			return
		}
		if c.pool.q.removeIdle(c, seq) {
			e.destroyAsync(c, "idle timeout")
		}
	}
	timers := []*time.Timer{time.AfterFunc(idle, expire)}
	if e.cfg.PauseAfter > 0 && e.cfg.PauseAfter < idle {
		timers = append(timers, time.AfterFunc(e.cfg.PauseAfter, func() { e.pauseIdle(c, seq) }))
	}
	c.setTimers(timers)
}

func (c *hotContainer) setTimers(timers []*time.Timer) {
	c.timerMu.Lock()
	defer c.timerMu.Unlock()
	for _, t := range c.timers {
		t.Stop()
	}
	c.timers = timers
}

// pauseIdle freezes c if it is still idle in the period seq. Holding opMu
// while pausing means a call that takes c meanwhile unpauses it after.
func (e *Engine) pauseIdle(c *hotContainer, seq uint64) {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if c.paused || !c.pool.q.isIdle(c, seq) {
		return
	}
	// See newCallConn: no connection is kept across a pause.
	c.conn.CloseIdle()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	if err := e.api.ContainerPause(ctx, c.id); err != nil {
		e.log.Warn("pause idle function container", "container", c.name, "err", err)
		return
	}
	c.paused = true
	e.setState(c, ContainerPaused)
}

// resume readies a container taken from the pool for a call: its timers
// stop, it is unpaused if paused, and one that exited is refused.
func (e *Engine) resume(ctx context.Context, c *hotContainer) error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.setTimers(nil)
	select {
	case <-c.exited:
		return fdksocket.ErrExited
	default:
	}
	if c.paused {
		if err := e.api.ContainerUnpause(ctx, c.id); err != nil {
			return fmt.Errorf("unpause: %w", err)
		}
		c.paused = false
	}
	e.setState(c, ContainerBusy)
	return nil
}

// destroyAsync removes c in the background, or now if the engine is
// closing.
func (e *Engine) destroyAsync(c *hotContainer, reason string) {
	if !e.goBackground(func() { e.destroy(c, reason) }) {
		e.destroy(c, reason)
	}
}

// destroy removes c's container, socket directory and reservation, once.
func (e *Engine) destroy(c *hotContainer, reason string) {
	c.destroyOnce.Do(func() {
		e.setState(c, ContainerRemoving)
		c.setTimers(nil)
		e.log.Debug("removing function container", "container", c.name, "reason", reason)
		if c.id != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := e.api.ContainerRemove(ctx, c.id, container.RemoveOptions{Force: true})
			cancel()
			if err != nil && !cerrdefs.IsNotFound(err) {
				e.log.Warn("remove function container", "container", c.name, "err", err)
			}
		}
		if c.holder != "" {
			e.removeHolder(c.holder)
		}
		if c.attached {
			c.attach.Close()
			select {
			case <-c.exited:
			case <-time.After(5 * time.Second):
			}
		}
		if c.conn != nil {
			c.conn.Close()
		}
		if err := os.RemoveAll(c.sockDir); err != nil {
			e.log.Warn("remove socket directory", "dir", c.sockDir, "err", err)
		}
		e.mu.Lock()
		res := c.reservation // set late for a prepared container (takePrepared)
		e.mu.Unlock()
		if res != nil { // a prepared container holds none until taken
			res.Release()
		}
		e.mu.Lock()
		delete(e.containers, c)
		c.pool.live--
		e.dropPoolLocked(c.pool)
		e.mu.Unlock()
		e.setState(c, ContainerNone)
		e.signal()
	})
}
