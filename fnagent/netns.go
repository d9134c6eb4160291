package fnagent

import (
	"context"
	"runtime"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/fnagent/internal/netnsholder"
)

// Network namespaces made ahead.
//
// Most of the daemon's start of a container on a bridge network is making
// its network namespace. A prepared container (prepare.go) is therefore
// created joining the namespace of a holder (package netnsholder), a tiny
// container started when the spare is prepared, on the engine's network,
// so the start on a cold call's path joins a namespace already made. The
// function's container then has the holder's hostname, /etc/hosts and DNS
// (containerConfig sets none of its own). A holder lives exactly as long
// as its function container: destroy removes both, and RemoveOrphans the
// holders a previous agent left.
//
// A holder is an optimisation, never a condition: on a network where
// joining brings nothing (netnsholder.Joinable), on an architecture with
// no holder program, or when the image or the holder cannot be made, the
// spare is prepared as before (why logged at debug), and a launch whose
// prepared container cannot start for its holder starts a fresh one.

// holderImage is the holder image once made, or the last failure to make
// it, which is not retried for holderRetry.
type holderImage struct {
	mu     sync.Mutex
	ref    string
	err    error
	failed time.Time
}

// holderRetry is how long a failure to make the holder image stands: the
// spares prepared meanwhile go without, rather than each asking the daemon
// again.
const holderRetry = time.Minute

// ensureHolderImage returns the holder image's reference, making it on
// first need (netnsholder.Ensure). Calls are serialized.
func (e *Engine) ensureHolderImage(ctx context.Context) (string, error) {
	h := &e.holderImage
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ref != "" {
		return h.ref, nil
	}
	if h.err != nil && e.now().Sub(h.failed) < holderRetry {
		return "", h.err
	}
	ref, err := netnsholder.Ensure(ctx, e.api, runtime.GOARCH)
	h.ref, h.err, h.failed = ref, err, e.now()
	return ref, err
}

// startHolder starts a holder for the function container named name and
// returns its ID, or "" when the container is to make its own namespace:
// the engine's network is not joinable, or the holder could not be made
// (logged at debug; a holder created but not started is removed).
func (e *Engine) startHolder(name string) string {
	if !netnsholder.Joinable(e.cfg.Network) {
		return ""
	}
	ctx := e.ctx
	ref, err := e.ensureHolderImage(ctx)
	if err != nil {
		e.log.Debug("preparing without a network namespace holder", "container", name, "err", err)
		return ""
	}
	labels := map[string]string{dockerengine.LabelHolder: name}
	if e.cfg.NodeID != "" {
		labels[dockerengine.LabelNode] = e.cfg.NodeID
	}
	config, hostConfig := netnsholder.ContainerConfig(ref, e.cfg.Network, *e.cfg.Containment, labels)
	created, err := e.api.ContainerCreate(ctx, config, hostConfig, nil, nil, name+"-netns")
	if err != nil {
		e.log.Debug("preparing without a network namespace holder", "container", name, "err", err)
		return ""
	}
	e.awaitNoStarts(holderStartWait)
	if err := e.api.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		e.log.Debug("preparing without a network namespace holder", "container", name, "err", err)
		e.removeHolder(created.ID)
		return ""
	}
	return created.ID
}

// holderStartWait bounds how long a holder's start waits for the
// launches' starts to pass (awaitNoStarts), so a node that never stops
// launching still gets its spares' holders.
const holderStartWait = 10 * time.Second

// startContainer is a launch's start of container id at the daemon,
// counted in Engine.starts while it lasts.
func (e *Engine) startContainer(ctx context.Context, id string) error {
	e.mu.Lock()
	e.starts++
	e.mu.Unlock()
	err := e.api.ContainerStart(ctx, id, container.StartOptions{})
	e.mu.Lock()
	e.starts--
	e.mu.Unlock()
	e.signal()
	return err
}

// awaitNoStarts waits until no launch is in the daemon's start of its
// container, for at most limit or until the engine closes. A holder's
// start makes a network namespace, which is most of a start's work and
// slows a start made beside it by as much: the holder is off every call's
// path, so it gives way. Launches do not wait for holders, and a launch
// waiting for a prepared container (awaitPrepared) is not yet counted, so
// nothing waits in a circle.
func (e *Engine) awaitNoStarts(limit time.Duration) {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		n, wake := e.starts, e.wake
		e.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-wake:
		case <-deadline.C:
			return
		case <-e.ctx.Done():
			return
		}
	}
}

// holdPrepared replaces plain, p's prepared container, with one created in
// a holder's namespace, when the engine can make holders. plain is made
// first and is there meanwhile, so a call arriving right after a deploy
// starts it at once rather than waiting for a holder's start; once the
// held one is created it takes plain's place and plain is removed. When a
// launch took plain meanwhile, or p keeps no prepared container any more,
// the held one is removed instead (a launch prepares the next).
func (e *Engine) holdPrepared(p *pool, plain *hotContainer) {
	if plain.holder != "" || !netnsholder.Joinable(e.cfg.Network) {
		return // joined a pooled namespace already (netnspool.go)
	}
	if _, err := e.ensureHolderImage(e.ctx); err != nil {
		e.log.Debug("keeping a prepared container without a network namespace holder", "container", plain.name, "err", err)
		return
	}
	held, err := e.create(p, nil, heldNamespace)
	if err != nil {
		e.log.Debug("preparing a function container in a held namespace", "fn", p.fn.ID, "err", err)
		return
	}
	e.mu.Lock()
	swap := held.holder != "" && p.prepared == plain && !e.closed && e.keepsPreparedLocked(p)
	if swap {
		p.prepared = held
		e.setState(held, ContainerPrepared) // under mu, before a launch can take it
	}
	e.mu.Unlock()
	if !swap {
		e.destroy(held, "prepared in a held namespace but not needed")
		return
	}
	e.destroy(plain, "replaced by a prepared container in a held namespace")
	e.expirePrepared(p, held)
}

// removeHolder removes the holder id, by force: its program, as PID 1 with
// no handler, ignores the stop signal.
func (e *Engine) removeHolder(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.api.ContainerRemove(ctx, id, container.RemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
		e.log.Warn("remove a network namespace holder", "holder", id, "err", err)
	}
}
