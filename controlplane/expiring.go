package controlplane

import (
	"sync"
	"time"
)

// expiring caches values read from the store by key, each for as long as
// its reader allows, and lets a writer of the key drop it: get returns the
// key's generation, put stores a value only if the generation is unchanged,
// and forget bumps it. So a read that raced with a write (read the old
// record, then the writer forgot the key, then the reader put) cannot put
// the old value back. The zero value is ready to use.
//
// It holds the nodes' fencing tokens (authcache.go) and the registry
// credentials (registries.go).
type expiring[V any] struct {
	mu  sync.Mutex
	m   map[string]expiringEntry[V]
	gen map[string]uint64
}

type expiringEntry[V any] struct {
	v  V
	at time.Time
}

// get returns key's value and whether it is fresh (put less than maxAge
// before now), and the key's generation, which put needs.
func (c *expiring[V]) get(key string, now time.Time, maxAge time.Duration) (v V, fresh bool, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	return e.v, ok && now.Sub(e.at) < maxAge, c.gen[key]
}

// put caches v for key, read at now, unless key was forgotten since its
// generation gen was read.
func (c *expiring[V]) put(key string, v V, gen uint64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen[key] != gen {
		return
	}
	if c.m == nil {
		c.m = map[string]expiringEntry[V]{}
	}
	c.m[key] = expiringEntry[V]{v: v, at: now}
}

// forget drops key's value: its record was just changed.
func (c *expiring[V]) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
	if c.gen == nil {
		c.gen = map[string]uint64{}
	}
	c.gen[key]++
}
