package fnagent

import (
	"strings"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/fnagent/internal/netnsholder"
)

// Network namespaces kept ready.
//
// A holder started for a spare (netns.go) helps only the call that finds
// that spare: a function's first call, a call right after its deploy, and
// every start beyond the spare (a burst) still made a namespace of its
// own, about two thirds of a cold start on a bridge network. So the engine
// keeps Config.NetnsPool holders started ahead, belonging to no function
// yet: a container created on a call's path, or prepared ahead, joins one
// when one is ready (never waiting for one), and the pool is filled again
// in the background, each holder's start giving way to launches' starts
// (awaitNoStarts). A pooled holder joins exactly one function container
// and goes with it (destroy), so no namespace is ever shared between
// containers, let alone functions. Pooled holders are labelled with this
// engine's pool prefix, so RemoveOrphans leaves those being made alone and
// a later agent removes what an earlier one left.

// holderMode says how a container being created gets its network
// namespace.
type holderMode int

const (
	// ownNamespace: the container makes its own (a launch replacing one
	// whose holder failed: no launch fails for a holder).
	ownNamespace holderMode = iota
	// pooledNamespace: a ready one from the pool when there is one, else
	// its own.
	pooledNamespace
	// heldNamespace: a ready one from the pool, else a holder started for
	// it (a spare, off every call's path).
	heldNamespace
)

// takeHolder hands out a ready holder from the pool, "" when none is
// ready, and has the pool filled again.
func (e *Engine) takeHolder() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var id string
	if n := len(e.netnsPool); n > 0 {
		id, e.netnsPool = e.netnsPool[n-1], e.netnsPool[:n-1]
	}
	e.fillPoolLocked()
	return id
}

// fillPoolLocked starts the pool's filling in the background unless it is
// full, being filled, off (Config.NetnsPool negative), or of no use on
// the engine's network. e.mu is held.
func (e *Engine) fillPoolLocked() {
	if e.poolFilling || len(e.netnsPool) >= e.cfg.NetnsPool || !netnsholder.Joinable(e.cfg.Network) {
		return
	}
	e.poolFilling = e.goBackgroundLocked(e.fillPool)
}

// fillPool starts holders until the pool is full. A holder that cannot be
// made ends the filling (logged at debug): the next take tries again.
func (e *Engine) fillPool() {
	for {
		e.mu.Lock()
		if e.closed || len(e.netnsPool) >= e.cfg.NetnsPool {
			e.poolFilling = false
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
		id := e.startHolder(e.poolPrefix + randomHex(6))
		e.mu.Lock()
		if id == "" || e.closed {
			e.poolFilling = false
			e.mu.Unlock()
			if id != "" {
				e.removeHolder(id)
			}
			return
		}
		e.netnsPool = append(e.netnsPool, id)
		e.mu.Unlock()
	}
}

// drainPool removes the pool's holders (the engine is closing).
func (e *Engine) drainPool() {
	e.mu.Lock()
	ids := e.netnsPool
	e.netnsPool = nil
	e.mu.Unlock()
	for _, id := range ids {
		e.removeHolder(id)
	}
}

// pooledHolder reports whether a holder's label marks it as one of this
// engine's pool (made or being made).
func (e *Engine) pooledHolder(labels map[string]string) bool {
	return strings.HasPrefix(labels[dockerengine.LabelHolder], e.poolPrefix)
}

// holderFor gives the container named name its holder by mode: "" when it
// makes its own namespace.
func (e *Engine) holderFor(name string, mode holderMode) string {
	if mode == ownNamespace {
		return ""
	}
	if id := e.takeHolder(); id != "" {
		return id
	}
	if mode == heldNamespace {
		return e.startHolder(name)
	}
	return ""
}
