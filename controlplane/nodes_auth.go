package controlplane

import (
	"context"

	"errors"
	"net/http"

	"github.com/mercator/mercator/api"

	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/internal/nodeauth"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Every node call is authenticated from the cache in internal/nodeauth
// (what it keeps, and why, is said there).

// nodeSession returns the session record of the credential hash and the
// node's fencing token, from the cache or the store.
func (s *Server) nodeSession(ctx context.Context, hash, nodeID string) (store.Session, nodeauth.Fence, error) {
	now := s.now()
	sess, haveSession := s.auth.Session(hash)
	fence, haveFence, gen := s.auth.Fence(nodeID, now)
	if haveFence && fence.Removed {
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
		if fence = nodeauth.FenceOf(n); fence.Removed {
			return removedError(nodeID) // its sessions are gone too
		}
		if !haveSession {
			sess, err = tx.GetSession(hash)
		}
		return err
	})
	if fence.Removed {
		s.auth.PutFence(nodeID, fence, gen, now)
	}
	if err != nil {
		return store.Session{}, fence, err
	}
	if !haveSession {
		s.auth.PutSession(hash, sess)
	}
	s.auth.PutFence(nodeID, fence, gen, now)
	return sess, fence, nil
}

// removedError refuses a node removed by `mercator node rm`. It is a
// fencing refusal (failure.ErrFenced), which the agent already treats as
// final: it stops, with this message, rather than retrying.
func removedError(nodeID string) error {
	return failure.Fenced("node %q was removed with `mercator node rm %s`: its credentials are void and the agent must stop; to bring it back, run `mercator node invite %s` and restart the agent with the new invitation", nodeID, nodeID, nodeID)
}

// fenceOf is the node's fencing token: the cached one if fresh, else read
// in tx (and cached); failure.ErrNotFound for a node not stored.
func (s *Server) fenceOf(tx store.Tx, nodeID string) (uint64, error) {
	fences, err := s.fencesOf(tx, []string{nodeID})
	if err != nil {
		return 0, err
	}
	fence, ok := fences[nodeID]
	if !ok {
		return 0, failure.NotFound("node", nodeID)
	}
	return fence, nil
}

// fencesOf is each of ids' fencing token (ids sorted, distinct): the
// cached ones if fresh, the misses read in one GetNodes (and cached). A
// node not stored is absent.
func (s *Server) fencesOf(tx store.Tx, ids []string) (map[string]uint64, error) {
	now := s.now()
	out := make(map[string]uint64, len(ids))
	var missed []string
	gens := map[string]uint64{}
	for _, id := range ids {
		fence, fresh, gen := s.auth.Fence(id, now)
		if fresh {
			out[id] = fence.Token
			continue
		}
		missed = append(missed, id)
		gens[id] = gen
	}
	if len(missed) == 0 {
		return out, nil
	}
	nodes, err := tx.GetNodes(missed)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		s.auth.PutFence(n.ID, nodeauth.FenceOf(n), gens[n.ID], now)
		out[n.ID] = n.FencingToken
	}
	return out, nil
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
	// The session and the node's fencing token come from the nodeauth cache when
	// it has them (see nodes_auth.go).
	sess, f, err := s.nodeSession(ctx, httpapi.HashToken(tok), nodeID)
	fence := f.Token
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
