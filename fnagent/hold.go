package fnagent

import (
	"sync"
	"time"
)

// Warm capacity.
//
// A function's containers are otherwise started by calls and removed after
// the function's idle timeout, so the first call after a deploy, or after
// a quiet spell, waits for a container to start (and, on a node that never
// ran the function, for its image). Hold lets the control plane ask ahead:
// the image is pulled now and count containers are started and kept, idle
// ones exempt from the idle timeout, while the hold lasts. Above the count,
// containers come and go with calls as before, so the idle timeout is the
// scale-down window; when the hold lapses, the held ones age out too.
// While a hold stands, a call that takes the pool's last idle container
// starts a spare (aheadOfDemand), so capacity grows ahead of the calls
// rather than behind them.
// Capacity still rules: held idle containers are evicted for another
// function's calls like any idle container.

// Hold pulls fn's image and starts containers until the pool has count in
// all, and keeps count of them started until d has passed; a later Hold
// replaces the count and the time. Count 0 only pulls the image. It
// returns at once; the pull and the launches run in the background, and a
// failure is logged (a call then starts a container itself, as without a
// hold). It fails only for a configuration a call would refuse too, or
// when the engine is closing.
func (e *Engine) Hold(fn FunctionConfig, count int, d time.Duration) error {
	fn, key, err := e.configs.normalize(fn)
	if err != nil {
		return &CallError{Kind: KindInvalid, Message: err.Error(), Err: err}
	}
	count = max(count, 0)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return callErr(KindBusy, nil, "the engine is closing")
	}
	p := e.poolLocked(fn, key)
	// The hold's reference keeps the pool in the map until its launches
	// have registered their containers (releaseHold).
	p.refs++
	p.auth = fn.RegistryAuth
	p.minHot, p.holdUntil, p.lastUse = count, e.now().Add(d), e.now()
	prepared := p.prepared
	e.mu.Unlock()
	if prepared != nil {
		e.expirePrepared(p, prepared) // checked again at the new lapse
	}
	started := e.goBackground(func() {
		defer e.releaseHold(p)
		// Asked afresh (not from ensureImage's memory), so an image
		// removed behind the engine's back is pulled again before a call
		// wants it.
		e.forgetImage(fn.Image)
		if _, err := e.ensureImage(e.ctx, fn.Image, fn.RegistryAuth); err != nil {
			e.log.Warn("prefetch of a held function's image failed", "fn", fn.ID, "err", err)
			return
		}
		e.prepare(p) // the next launch's container, created ahead (prepare.go)
		var wg sync.WaitGroup
		for n := p.q.claimWarm(count); n > 0; n-- {
			res, err := e.reserve(p)
			if err != nil {
				for ; n > 0; n-- {
					p.q.unclaim()
				}
				e.log.Warn("cannot hold all of a function's containers", "fn", fn.ID, "count", count, "err", err)
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				e.runLaunch(p, res, nil)
			}()
		}
		wg.Wait()
	})
	if !started {
		e.releaseHold(p)
		return callErr(KindBusy, nil, "the engine is closing")
	}
	return nil
}

func (e *Engine) releaseHold(p *pool) {
	e.mu.Lock()
	p.refs--
	e.dropPoolLocked(p)
	e.mu.Unlock()
}

// keepWarm reports whether p's hold stands and keeps its idle containers:
// the hold has not lapsed and the pool is at or below its count.
func (e *Engine) keepWarm(p *pool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return p.minHot > 0 && e.now().Before(p.holdUntil) && p.q.total() <= p.minHot
}

// aheadOfDemand starts one more container of a held pool when a call has
// just taken its last idle one and none is starting, so the next call
// finds one started. Above the hold's count the spare ages out after the
// idle timeout like any container; capacity and MaxConcurrency bound it.
func (e *Engine) aheadOfDemand(p *pool) {
	// The calling call's reference keeps p in the map until here; the
	// spare's launch takes one of its own until it is registered.
	e.mu.Lock()
	held := p.minHot > 0 && e.now().Before(p.holdUntil) && !e.closed
	e.mu.Unlock()
	if !held || !p.q.claimSpare() {
		return
	}
	e.mu.Lock()
	p.refs++
	e.mu.Unlock()
	started := e.goBackground(func() {
		defer e.releaseHold(p)
		res, err := e.reserve(p)
		if err != nil {
			p.q.unclaim()
			return
		}
		e.runLaunch(p, res, nil)
	})
	if !started {
		p.q.unclaim()
		e.releaseHold(p)
	}
}
