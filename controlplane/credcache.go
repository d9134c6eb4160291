package controlplane

import (
	"sync"
	"time"

	"github.com/mercator/mercator/store"
)

// credCache keeps the registry credentials read from the store, found or
// not, for registryCredTTL. Every launch and image command handed to a node carries
// its registry's credential when one is stored (outbound), so without the
// cache a fleet busy with placements read the store once per command, and
// those reads queued for the store's few connections behind everything
// else. A credential changed on this replica is dropped from its cache at
// once (putRegistry, deleteRegistry); one changed on another replica is
// seen here within registryCredTTL. A generation per host keeps a read that raced
// with such a drop from putting the old value back.
type credCache struct {
	mu  sync.Mutex
	m   map[string]credEntry // by normalized host
	gen map[string]uint64    // by host: bumped by forget
}

type credEntry struct {
	cred  store.RegistryCredential
	found bool
	at    time.Time
}

// registryCredTTL bounds how long another replica's change may go unseen here.
const registryCredTTL = 5 * time.Second

// get returns host's cached credential and whether one is stored, when the
// cache holds a fresh answer (ok), and the host's generation, which put
// needs.
func (c *credCache) get(host string, now time.Time) (cred store.RegistryCredential, found, ok bool, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, hit := c.m[host]
	return e.cred, e.found, hit && now.Sub(e.at) < registryCredTTL, c.gen[host]
}

// put caches what the store answered for host, unless the host was
// forgotten since its generation was read.
func (c *credCache) put(host string, cred store.RegistryCredential, found bool, gen uint64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen[host] != gen {
		return
	}
	if c.m == nil {
		c.m = map[string]credEntry{}
	}
	c.m[host] = credEntry{cred: cred, found: found, at: now}
}

// forget drops host's entry: its credential was just changed or removed.
func (c *credCache) forget(host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, host)
	if c.gen == nil {
		c.gen = map[string]uint64{}
	}
	c.gen[host]++
}
