package fnagent

import "time"

// Prepared containers.
//
// A cold start is the image check, the container's creation and attach,
// the daemon's start and the FDK's start-up (LaunchTimes). The first two
// are taken ahead: a pool keeps one container created and attached but not
// started, and its next launch starts it (skipping the image check too:
// the daemon holds an image while a container uses it), then prepares the
// next. Its network namespace is made ahead too (holdPrepared): once it
// is in place, a second is created joining the namespace of a holder
// started for it (netns.go) and takes its place, so the start, which on a
// bridge network spends most of its time making a namespace, does not;
// the first is there at once for a call that arrives meanwhile. A prepared
// container holds no reservation (a created container uses no memory or
// CPU; its holder a few pages, under a 6 MiB limit) and is kept
//
//   - while the pool's hold stands (Hold, a deploy's prefetch included),
//     whatever the count;
//   - without a hold, for Config.SpareFor after the pool's last call or
//     hold, so the first call after a scale to zero starts one, for at most
//     Config.MaxSpares pools at once: a pool that wants one when the limit
//     is reached takes the place of the least recently called, if that
//     was called before it, and goes without otherwise.
//
// It goes sooner when the function is deleted (Forget) or when a new pool
// of the same function appears on the node, its image or configuration
// changed (supersedeLocked). Functions with GPUs are not prepared, because
// their devices are chosen when the launch reserves them.

// prepare makes a container for p's next launch in the background, unless
// p has one or is making one, keeps none (keepsPreparedLocked), needs
// GPUs, or finds no room under Config.MaxSpares.
func (e *Engine) prepare(p *pool) {
	e.mu.Lock()
	want := p.prepared == nil && !p.preparing && p.fn.GPUs == 0 && !e.closed && e.keepsPreparedLocked(p)
	var evicted *hotContainer
	if want && !e.now().Before(p.holdUntil) {
		want, evicted = e.spareRoomLocked(p)
	}
	var done chan struct{}
	if want {
		p.preparing = true
		done = make(chan struct{})
		p.prepDone, p.prepAwaited = done, false
		p.refs++ // until the container is registered or given up (releaseHold)
	}
	e.mu.Unlock()
	if evicted != nil {
		e.destroyAsync(evicted, "a more recently called function's spare took its place")
	}
	if !want {
		return
	}
	started := e.goBackground(func() {
		defer e.releaseHold(p)
		c, err := e.create(p, nil, pooledNamespace)
		e.mu.Lock()
		p.preparing = false
		keep := err == nil && p.prepared == nil && !e.closed && e.keepsPreparedLocked(p)
		if keep {
			p.prepared = c
			e.setState(c, ContainerPrepared) // under mu, before a launch can take it
		}
		e.mu.Unlock()
		close(done) // after p.prepared is set: a waiting launch takes it
		switch {
		case err != nil:
			e.log.Debug("preparing a function container", "fn", p.fn.ID, "err", err)
		case !keep:
			e.destroy(c, "prepared but not needed")
		default:
			e.expirePrepared(p, c)
			e.holdPrepared(p, c)
		}
	})
	if !started {
		e.mu.Lock()
		p.preparing = false
		e.mu.Unlock()
		close(done)
		e.releaseHold(p)
	}
}

// awaitPrepared is takePrepared for a launch that found no prepared
// container while one is being made: the first such launch waits for it
// and takes it, rather than creating another beside it at the daemon (a
// deploy's hold prepares one as its first call arrives, and a held pool
// launches its minimum right after preparing); the wait is a create, as
// the holder comes after (holdPrepared). Only one launch
// waits, so a burst's other launches are not held back. It returns nil
// when nothing is being prepared, another launch waits already, the
// preparing failed or was not kept, or the engine is closing.
func (e *Engine) awaitPrepared(p *pool, res *Reservation) *hotContainer {
	e.mu.Lock()
	done := p.prepDone
	wait := p.preparing && !p.prepAwaited
	if wait {
		p.prepAwaited = true
	}
	e.mu.Unlock()
	if !wait {
		return nil
	}
	select {
	case <-done:
	case <-e.ctx.Done():
		return nil
	}
	return e.takePrepared(p, res)
}

// keepsPreparedLocked reports whether p keeps a prepared container now:
// its hold stands, or it was called or held within Config.SpareFor and
// spares are on.
func (e *Engine) keepsPreparedLocked(p *pool) bool {
	return e.now().Before(e.preparedUntilLocked(p))
}

// preparedUntilLocked is when p stops keeping a prepared container, as
// things stand: the later of its hold's lapse and, with spares on,
// Config.SpareFor after its last use.
func (e *Engine) preparedUntilLocked(p *pool) time.Time {
	until := p.holdUntil
	if e.cfg.MaxSpares > 0 && !p.lastUse.IsZero() {
		if spare := p.lastUse.Add(e.cfg.SpareFor); spare.After(until) {
			until = spare
		}
	}
	return until
}

// spareRoomLocked reports whether p, which has no hold standing, may make
// a spare under Config.MaxSpares, and which other pool's spare it takes
// the place of (taken off that pool here; the caller removes it): the
// least recently used of the unheld pools' prepared containers, when the
// limit is reached and that pool was used before p.
func (e *Engine) spareRoomLocked(p *pool) (bool, *hotContainer) {
	if e.cfg.MaxSpares <= 0 {
		return false, nil
	}
	now := e.now()
	n := 0
	var lru *pool
	for _, o := range e.pools {
		if o == p || now.Before(o.holdUntil) || o.prepared == nil && !o.preparing {
			continue
		}
		n++
		if o.prepared != nil && (lru == nil || o.lastUse.Before(lru.lastUse)) {
			lru = o
		}
	}
	if n < e.cfg.MaxSpares {
		return true, nil
	}
	if lru == nil || !lru.lastUse.Before(p.lastUse) {
		return false, nil
	}
	c := lru.prepared
	lru.prepared = nil
	return true, c
}

// supersedeLocked removes the prepared containers of the other pools of
// p's function, which p, new, supersedes: the function's image or
// configuration changed, and the old pools' next launches are unlikely.
// Their started containers age out as any; their last use is forgotten,
// so a launch of theirs prepares no other.
func (e *Engine) supersedeLocked(p *pool) {
	for _, o := range e.pools {
		if o == p || o.fn.ID != p.fn.ID {
			continue
		}
		o.lastUse = time.Time{}
		if c := o.prepared; c != nil {
			o.prepared = nil
			e.goBackgroundLocked(func() { e.destroy(c, "the function's configuration changed") })
		}
	}
}

// Forget drops what the engine keeps of function fnID ahead of its calls:
// its holds lapse, and its prepared and idle containers are removed. Calls
// in flight finish, their containers then aging out. The agent calls it
// when the control plane says the function was deleted
// (nodeproto.HoldCommand.Release). It returns how many containers it
// removed.
func (e *Engine) Forget(fnID string) int {
	e.mu.Lock()
	var gone []*hotContainer
	var pools []*pool
	for _, p := range e.pools {
		if p.fn.ID != fnID {
			continue
		}
		p.minHot, p.holdUntil, p.lastUse = 0, time.Time{}, time.Time{}
		if p.prepared != nil {
			gone = append(gone, p.prepared)
			p.prepared = nil
		}
		pools = append(pools, p)
	}
	e.mu.Unlock()
	for _, p := range pools {
		for _, s := range p.q.idleSlots() {
			if p.q.removeIdle(s.slot, s.seq) {
				gone = append(gone, s.slot)
			}
		}
	}
	for _, c := range gone {
		e.destroyAsync(c, "function deleted")
	}
	return len(gone)
}

// takePrepared hands p's prepared container to a launch holding res, or
// nil when there is none (or it was removed meanwhile). The reservation is
// set under Engine.mu, where destroy reads it.
func (e *Engine) takePrepared(p *pool, res *Reservation) *hotContainer {
	e.mu.Lock()
	c := p.prepared
	p.prepared = nil
	var gone *hotContainer
	if c != nil {
		select {
		case <-c.exited: // removed (the engine closing) or gone
			c, gone = nil, c
		default:
			c.reservation = res
			e.setState(c, ContainerStarting)
		}
	}
	e.mu.Unlock()
	if gone != nil {
		e.destroy(gone, "prepared container unusable")
	}
	return c
}

// expirePrepared removes c once p stops keeping it (preparedUntilLocked),
// if no launch has taken it by then; a renewed hold or a call pushes the
// check back.
//
// One check is pending per pool (pool.expiry): a later call replaces it,
// so a hold renewed every few seconds does not pile up timers.
func (e *Engine) expirePrepared(p *pool, c *hotContainer) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p.prepared != c {
		return // taken by a launch, or replaced (whose own check stands)
	}
	left := e.preparedUntilLocked(p).Sub(e.now())
	if p.expiry != nil {
		p.expiry.Stop()
	}
	p.expiry = time.AfterFunc(max(left, 0)+time.Millisecond, func() {
		e.mu.Lock()
		if p.prepared != c {
			e.mu.Unlock()
			return // taken by a launch, or replaced
		}
		if e.keepsPreparedLocked(p) && !e.closed {
			e.mu.Unlock()
			e.expirePrepared(p, c)
			return
		}
		p.prepared = nil
		e.mu.Unlock()
		e.destroyAsync(c, "no longer kept")
	})
}
