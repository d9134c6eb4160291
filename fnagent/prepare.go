package fnagent

import "time"

// Prepared containers.
//
// A cold start is the image check, the container's creation and attach,
// the daemon's start and the FDK's start-up (LaunchTimes). While a pool's
// hold stands (Hold, a prefetch included), the first two steps are taken
// ahead: one container is kept created and attached but not started, and
// the pool's next launch starts it, then prepares the next. It holds no
// reservation (a created container uses no memory or CPU) and is removed
// once the hold lapses. Functions with GPUs are not prepared, because
// their devices are chosen when the launch reserves them.

// prepare makes a container for p's next launch in the background, unless
// p has one or is making one, has no hold standing, or needs GPUs.
func (e *Engine) prepare(p *pool) {
	e.mu.Lock()
	want := p.prepared == nil && !p.preparing && p.fn.GPUs == 0 && e.now().Before(p.holdUntil) && !e.closed
	if want {
		p.preparing = true
		p.refs++ // until the container is registered or given up (releaseHold)
	}
	e.mu.Unlock()
	if !want {
		return
	}
	started := e.goBackground(func() {
		defer e.releaseHold(p)
		c, err := e.create(p, nil)
		e.mu.Lock()
		p.preparing = false
		keep := err == nil && p.prepared == nil && !e.closed
		if keep {
			p.prepared = c
		}
		e.mu.Unlock()
		switch {
		case err != nil:
			e.log.Debug("preparing a function container", "fn", p.fn.ID, "err", err)
		case !keep:
			e.destroy(c, "prepared but not needed")
		default:
			e.expirePrepared(p, c)
		}
	})
	if !started {
		e.mu.Lock()
		p.preparing = false
		e.mu.Unlock()
		e.releaseHold(p)
	}
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
		}
	}
	e.mu.Unlock()
	if gone != nil {
		e.destroy(gone, "prepared container unusable")
	}
	return c
}

// expirePrepared removes c once p's hold has lapsed, if no launch has
// taken it by then; a renewed hold pushes the check back.
func (e *Engine) expirePrepared(p *pool, c *hotContainer) {
	e.mu.Lock()
	left := p.holdUntil.Sub(e.now())
	e.mu.Unlock()
	time.AfterFunc(max(left, 0)+time.Millisecond, func() {
		e.mu.Lock()
		if p.prepared != c {
			e.mu.Unlock()
			return // taken by a launch, or replaced
		}
		if e.now().Before(p.holdUntil) && !e.closed {
			e.mu.Unlock()
			e.expirePrepared(p, c)
			return
		}
		p.prepared = nil
		e.mu.Unlock()
		e.destroyAsync(c, "hold lapsed")
	})
}
