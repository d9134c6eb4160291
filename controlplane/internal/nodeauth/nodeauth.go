// Package nodeauth caches what authenticating a node call needs. Every
// node call (a heartbeat every few seconds from every node) is
// authenticated: its session credential must exist, be unexpired, and hold
// the node's current fencing token. Reading the session and the node from
// the store for each call was, at ten thousand nodes, a thousand read
// transactions a second queueing for the store's connections. Cache
// keeps both:
//
//   - Session records, by credential hash. A record changes only when a
//     renewal retires it (its expiry shortened) or `mercator node rm`
//     deletes it, and both send the node's "fence:ID" signal, which drops
//     the node's cached sessions on every replica; its expiry is checked
//     at every use. Only credentials the store holds are kept.
//   - Each node's fencing token and whether it was removed, for fenceTTL
//     at most, and dropped as soon as this replica hears the node was
//     enrolled again, renewed or removed (the "fence:ID" signal, sent
//     wherever those commit). A generation per node keeps a read that
//     raced with the drop from putting the old token back.
//
// A signal dropped on the way is said afterwards (signals.Lost), and then
// everything cached is dropped (ForgetAll). What the cache can therefore
// miss is an enrollment on another replica whose signal has not arrived
// yet, or one lost without a word, for at most fenceTTL. Every decision that
// matters is fenced again where it is made (package controlplane): a batch
// of events re-reads the node's token in the transaction that applies it;
// a session stream checks it whenever it wakes, and an enrollment wakes it.
//
// Only package controlplane may import it.
package nodeauth

import (
	"sync"
	"time"

	"github.com/mercator/mercator/controlplane/internal/expiring"
	"github.com/mercator/mercator/store"
)

// Cache is the node-call cache the package comment describes. The zero
// value is ready to use; safe for concurrent use.
type Cache struct {
	mu       sync.Mutex
	sessions map[string]store.Session // by token hash
	byNode   map[string][]string      // node ID → hashes in sessions
	fences   expiring.Map[Fence]      // by node ID
}

// Fence is what Cache keeps of a node record.
type Fence struct {
	Token   uint64
	Removed bool // `mercator node rm`
}

// fenceTTL bounds how long a fencing token read from the store is used:
// much longer than a heartbeat, or heartbeats would read it again. It was
// a minute before a lost signal dropped every cached token (ForgetAll): at
// 10,000 nodes on PostgreSQL that was a read of a node's whole record a
// node a minute on every replica, 5% of the control plane's CPU.
const fenceTTL = 10 * time.Minute

// maxCachedSessions bounds the session records kept; past it the cache
// starts over (a few reads, then it is warm again).
const maxCachedSessions = 1 << 18

// Session is the cached session record of a credential hash.
func (a *Cache) Session(hash string) (store.Session, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sessions[hash]
	return s, ok
}

// PutSession caches a session record the store holds.
func (a *Cache) PutSession(hash string, s store.Session) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sessions == nil || len(a.sessions) >= maxCachedSessions {
		a.sessions, a.byNode = map[string]store.Session{}, map[string][]string{}
	}
	a.sessions[hash] = s
	a.byNode[s.NodeID] = append(a.byNode[s.NodeID], hash)
}

// Fence returns the node's cached fencing token, if fresh, and the node's
// generation, which PutFence needs.
func (a *Cache) Fence(nodeID string, now time.Time) (Fence, bool, uint64) {
	return a.fences.Get(nodeID, now, fenceTTL)
}

// PutFence caches a node's fence read from the store at now.
func (a *Cache) PutFence(nodeID string, f Fence, gen uint64, now time.Time) {
	a.fences.Put(nodeID, f, gen, now) // not if the node changed while its record was read
}

// Forget drops what is cached about the node: its fence and its sessions.
func (a *Cache) Forget(nodeID string) {
	a.fences.Forget(nodeID)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, h := range a.byNode[nodeID] {
		delete(a.sessions, h)
	}
	delete(a.byNode, nodeID)
}

// ForgetAll drops everything cached, fences and sessions: a signal was
// lost, and any of them may have changed.
func (a *Cache) ForgetAll() {
	a.fences.ForgetAll()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sessions, a.byNode = nil, nil
}

// FenceOf is what Cache keeps of a node record.
func FenceOf(n store.Node) Fence {
	return Fence{Token: n.FencingToken, Removed: n.RemovedAt != nil}
}
