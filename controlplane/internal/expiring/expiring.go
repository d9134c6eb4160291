// Package expiring is a small cache of values read from the store, each
// kept for as long as its reader allows, that a writer of the key can
// invalidate without a racing reader putting the old value back. Only
// package controlplane and its subpackages may import it.
package expiring

import (
	"sync"
	"time"
)

// Map caches values read from the store by key, each for as long as
// its reader allows, and lets a writer of the key drop it: Get returns the
// key's generation, Put stores a value only if the generation is unchanged,
// and Forget bumps it. So a read that raced with a write (read the old
// record, then the writer forgot the key, then the reader put) cannot put
// the old value back. The zero value is ready to use.
//
// It holds the nodes' fencing tokens (package controlplane/internal/
// nodeauth) and the registry credentials (package controlplane/registry).
type Map[V any] struct {
	mu    sync.Mutex
	m     map[string]expiringEntry[V]
	gen   map[string]uint64
	epoch uint64 // ForgetAll's count, part of every key's generation
}

type expiringEntry[V any] struct {
	v  V
	at time.Time
}

// Get returns key's value and whether it is fresh (put less than maxAge
// before now), and the key's generation, which Put needs.
func (c *Map[V]) Get(key string, now time.Time, maxAge time.Duration) (v V, fresh bool, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	return e.v, ok && now.Sub(e.at) < maxAge, c.generation(key)
}

// generation is key's generation: its own Forgets and every ForgetAll
// (both only grow, so any of them changes the sum). The caller holds mu.
func (c *Map[V]) generation(key string) uint64 { return c.gen[key] + c.epoch }

// Put caches v for key, read at now, unless key was forgotten since its
// generation gen was read.
func (c *Map[V]) Put(key string, v V, gen uint64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.generation(key) != gen {
		return
	}
	if c.m == nil {
		c.m = map[string]expiringEntry[V]{}
	}
	c.m[key] = expiringEntry[V]{v: v, at: now}
}

// Forget drops key's value: its record was just changed.
func (c *Map[V]) Forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
	if c.gen == nil {
		c.gen = map[string]uint64{}
	}
	c.gen[key]++
}

// ForgetAll drops every value, and no read begun before it can put one
// back: any of them may have changed (a signal that would have said which
// was lost on the way).
func (c *Map[V]) ForgetAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m = nil
	c.epoch++
}
