package controlplane

import (
	"context"
	"errors"
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
//   - Session records, by credential hash. A record never changes (a
//     renewal stores a new one), so a cached one is the record; its expiry
//     is checked at every use. Only credentials the store holds are kept.
//   - Each node's fencing token, for fenceTTL at most, and dropped as soon
//     as this replica hears the node was enrolled again (the "fence:ID"
//     signal, which an enrollment sends wherever it commits). A generation
//     per node keeps a read that raced with the drop from putting the old
//     token back.
//
// What the cache can therefore miss is an enrollment on another replica
// whose signal has not arrived, for at most fenceTTL. Every decision that
// matters is fenced again where it is made: a batch of events re-reads the
// node's token in the transaction that applies it; a session stream checks
// it (fenceOf) whenever it wakes, and an enrollment wakes it.
type authCache struct {
	mu       sync.Mutex
	sessions map[string]store.Session // by token hash
	fences   expiring.Map[uint64]     // by node ID
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
		a.sessions = map[string]store.Session{}
	}
	a.sessions[hash] = s
}

// fence returns the node's cached fencing token, if fresh, and the node's
// generation, which putFence needs.
func (a *authCache) fence(nodeID string, now time.Time) (uint64, bool, uint64) {
	return a.fences.Get(nodeID, now, fenceTTL)
}

func (a *authCache) putFence(nodeID string, token uint64, gen uint64, now time.Time) {
	a.fences.Put(nodeID, token, gen, now) // not if the node changed while its record was read
}

// forget drops what is cached about the node.
func (a *authCache) forget(nodeID string) { a.fences.Forget(nodeID) }

// nodeSession returns the session record of the credential hash and the
// node's fencing token, from the cache or the store.
func (s *Server) nodeSession(ctx context.Context, hash, nodeID string) (store.Session, uint64, error) {
	now := s.now()
	sess, haveSession := s.auth.session(hash)
	fence, haveFence, gen := s.auth.fence(nodeID, now)
	if haveSession && haveFence {
		return sess, fence, nil
	}
	err := s.store.View(ctx, func(tx store.Tx) error {
		if !haveSession {
			var err error
			if sess, err = tx.GetSession(hash); err != nil {
				return err
			}
		}
		n, err := tx.GetNode(nodeID)
		if err != nil {
			return err
		}
		fence = n.FencingToken
		return nil
	})
	if err != nil {
		return store.Session{}, 0, err
	}
	if !haveSession {
		s.auth.putSession(hash, sess)
	}
	s.auth.putFence(nodeID, fence, gen, now)
	return sess, fence, nil
}

// fenceOf is the node's fencing token: the cached one if fresh, else read
// in tx (and cached).
func (s *Server) fenceOf(tx store.Tx, nodeID string) (uint64, error) {
	now := s.now()
	fence, fresh, gen := s.auth.fence(nodeID, now)
	if fresh {
		return fence, nil
	}
	n, err := tx.GetNode(nodeID)
	if err != nil {
		return 0, err
	}
	s.auth.putFence(nodeID, n.FencingToken, gen, now)
	return n.FencingToken, nil
}

// nodeAuth requires a valid, current session credential and refuses one
// fenced below the node's token with failure.ErrFenced.
func (s *Server) nodeAuth(h func(http.ResponseWriter, *http.Request, httpapi.NodeCaller)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := s.authenticateNode(r.Context(), r)
		if err != nil {
			s.metrics.Refused.WithLabelValues(failure.Code(err)).Inc()
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
	sess, fence, err := s.nodeSession(ctx, httpapi.HashToken(tok), nodeID)
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
