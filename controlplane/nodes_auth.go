package controlplane

import (
	"context"

	"errors"
	"github.com/mercator/mercator/api"
	"net/http"
	"sync"
	"time"

	"github.com/mercator/mercator/controlplane/internal/expiring"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Every node call (a heartbeat every few seconds from every node) is
// authenticated: its session credential must exist, be unexpired, and hold
// the node's current fencing token. Reading the session and the node from
// the store for each call was, at ten thousand nodes, a thousand read
// transactions a second queueing for the store's connections. authCache
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
// What the cache can therefore miss is an enrollment on another replica
// whose signal has not arrived, for at most fenceTTL. Every decision that
// matters is fenced again where it is made: a batch of events re-reads the
// node's token in the transaction that applies it; a session stream checks
// it (fenceOf) whenever it wakes, and an enrollment wakes it.
type authCache struct {
	mu       sync.Mutex
	sessions map[string]store.Session // by token hash
	byNode   map[string][]string      // node ID → hashes in sessions
	fences   expiring.Map[nodeFence]  // by node ID
}

// nodeFence is what authCache keeps of a node record.
type nodeFence struct {
	token   uint64
	removed bool // `mercator node rm`
}

// fenceTTL bounds how long a fencing token read from the store is used: longer
// than a heartbeat, or every heartbeat would read it again.
const fenceTTL = time.Minute

// maxCachedSessions bounds the session records kept; past it the cache
// starts over (a few reads, then it is warm again).
const maxCachedSessions = 1 << 18

func (a *authCache) session(hash string) (store.Session, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sessions[hash]
	return s, ok
}

func (a *authCache) putSession(hash string, s store.Session) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sessions == nil || len(a.sessions) >= maxCachedSessions {
		a.sessions, a.byNode = map[string]store.Session{}, map[string][]string{}
	}
	a.sessions[hash] = s
	a.byNode[s.NodeID] = append(a.byNode[s.NodeID], hash)
}

// fence returns the node's cached fencing token, if fresh, and the node's
// generation, which putFence needs.
func (a *authCache) fence(nodeID string, now time.Time) (nodeFence, bool, uint64) {
	return a.fences.Get(nodeID, now, fenceTTL)
}

func (a *authCache) putFence(nodeID string, f nodeFence, gen uint64, now time.Time) {
	a.fences.Put(nodeID, f, gen, now) // not if the node changed while its record was read
}

// forget drops what is cached about the node: its fence and its sessions.
func (a *authCache) forget(nodeID string) {
	a.fences.Forget(nodeID)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, h := range a.byNode[nodeID] {
		delete(a.sessions, h)
	}
	delete(a.byNode, nodeID)
}

func fenceOfNode(n store.Node) nodeFence {
	return nodeFence{token: n.FencingToken, removed: n.RemovedAt != nil}
}

// nodeSession returns the session record of the credential hash and the
// node's fencing token, from the cache or the store.
func (s *Server) nodeSession(ctx context.Context, hash, nodeID string) (store.Session, nodeFence, error) {
	now := s.now()
	sess, haveSession := s.auth.session(hash)
	fence, haveFence, gen := s.auth.fence(nodeID, now)
	if haveFence && fence.removed {
		return store.Session{}, fence, removedError(nodeID)
	}
	if haveSession && haveFence {
		return sess, fence, nil
	}
	err := s.store.View(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode(nodeID)
		if err != nil {
			return err
		}
		if fence = fenceOfNode(n); fence.removed {
			return removedError(nodeID) // its sessions are gone too
		}
		if !haveSession {
			sess, err = tx.GetSession(hash)
		}
		return err
	})
	if fence.removed {
		s.auth.putFence(nodeID, fence, gen, now)
	}
	if err != nil {
		return store.Session{}, fence, err
	}
	if !haveSession {
		s.auth.putSession(hash, sess)
	}
	s.auth.putFence(nodeID, fence, gen, now)
	return sess, fence, nil
}

// removedError refuses a node removed by `mercator node rm`. It is a
// fencing refusal (failure.ErrFenced), which the agent already treats as
// final: it stops, with this message, rather than retrying.
func removedError(nodeID string) error {
	return failure.Fenced("node %q was removed with `mercator node rm %s`: its credentials are void and the agent must stop; to bring it back, run `mercator node invite %s` and restart the agent with the new invitation", nodeID, nodeID, nodeID)
}

// fenceOf is the node's fencing token: the cached one if fresh, else read
// in tx (and cached).
func (s *Server) fenceOf(tx store.Tx, nodeID string) (uint64, error) {
	now := s.now()
	fence, fresh, gen := s.auth.fence(nodeID, now)
	if fresh {
		return fence.token, nil
	}
	n, err := tx.GetNode(nodeID)
	if err != nil {
		return 0, err
	}
	s.auth.putFence(nodeID, fenceOfNode(n), gen, now)
	return n.FencingToken, nil
}

// nodeAuth requires a valid, current session credential and refuses one
// fenced below the node's token with failure.ErrFenced.
func (s *Server) nodeAuth(h func(http.ResponseWriter, *http.Request, httpapi.NodeCaller)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := s.authenticateNode(r.Context(), r)
		if err != nil {
			s.metrics.Refused.WithLabelValues(failure.Code(err)).Inc()
			s.auditNode(r, r.Header.Get(nodeproto.HeaderNodeID), api.StatusOf(err))
			httpapi.WriteError(w, err)
			return
		}
		h(w, r, c)
	})
}

func (s *Server) authenticateNode(ctx context.Context, r *http.Request) (httpapi.NodeCaller, error) {
	tok, ok := httpapi.Bearer(r)
	nodeID := r.Header.Get(nodeproto.HeaderNodeID)
	if !ok || nodeID == "" {
		return httpapi.NodeCaller{}, failure.Unauthorized("node calls need `Authorization: Bearer <session token>` and %s", nodeproto.HeaderNodeID)
	}
	// The session and the node's fencing token come from authCache when
	// it has them (see nodes_auth.go).
	sess, f, err := s.nodeSession(ctx, httpapi.HashToken(tok), nodeID)
	fence := f.token
	if errors.Is(err, failure.ErrNotFound) || (err == nil && sess.NodeID != nodeID) {
		return httpapi.NodeCaller{}, failure.Unauthorized("session credential not recognised for node %q; enroll again with a new invitation", nodeID)
	}
	if err != nil {
		return httpapi.NodeCaller{}, err
	}
	if !sess.ExpiresAt.After(s.now()) {
		return httpapi.NodeCaller{}, failure.Unauthorized("session credential for node %q expired at %s; the agent was offline past its credential's life: run `mercator node invite %s` and restart the agent with the new token", nodeID, sess.ExpiresAt.Format("2006-01-02T15:04:05Z07:00"), nodeID)
	}
	if sess.FencingToken < fence {
		return httpapi.NodeCaller{}, fencedError(nodeID, fence, sess.FencingToken)
	}
	return httpapi.NodeCaller{NodeID: nodeID, Session: sess}, nil
}

func fencedError(nodeID string, fence, held uint64) error {
	return failure.Fenced("node %q was enrolled again (fencing token %d); this session holds token %d and may no longer act for it", nodeID, fence, held)
}

// auditNode records a node-protocol call in the audit log: a refused
// credential, or a renewal (enrollment is audited by its route's wrapper).
// who is the node the call claims to be.
func (s *Server) auditNode(r *http.Request, nodeID string, status int) {
	s.audit.Record(store.AuditEntry{Who: "node:" + nodeID, Role: "node", Remote: r.RemoteAddr, Method: r.Method,
		Route: r.Pattern, Object: nodeID, Status: status})
}
