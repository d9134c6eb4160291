package controlplane

import (
	"net/http"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/store"
)

// Revocation of node credentials: `mercator node rm` (removeNode), the
// invitations a new one supersedes (revokeUnused, from inviteNode), and the
// session credential a renewal retires (retireSessions, from renew).

// renewOverlap is how long the credential a renewal replaces stays valid:
// enough for calls already in flight with it, so that at most two of a
// node's session credentials are ever valid, and the older only briefly.
const renewOverlap = time.Minute

// removeNode ends a node's sessions and unused invitations at once and
// fences it: its fencing token rises, so every command and event of the
// old enrollment is refused; its agent's next call is answered with
// removedError, on which the agent stops; and its work is treated as on an
// unreachable node from now (lostSince). The record stays, marked removed,
// so its runs keep naming a node that exists; `mercator node invite`
// brings it back.
func (s *Server) removeNode(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var out api.Node
	err := s.update(r.Context(), func(tx store.Tx) error {
		n, err := tx.GetNode(id)
		if err != nil {
			return err
		}
		now := s.now()
		if n.RemovedAt == nil {
			n.RemovedAt = &now
			n.FencingToken++
		}
		if err := tx.PutNode(n); err != nil {
			return err
		}
		if err := tx.DeleteSessions(id); err != nil {
			return err
		}
		if err := revokeUnused(tx, id, ""); err != nil {
			return err
		}
		out = s.nodeView(n, nil)
		return nil
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.log.Info("node removed", "node", id)
	s.fenceChanged(id) // every replica drops its cached fence and sessions, and ends the node's stream
	s.wakeReconcile()
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// revokeUnused deletes the node's invitations that were never spent, but
// keep (a new one's hash).
func revokeUnused(tx store.Tx, nodeID, keep string) error {
	invs, err := tx.ListInvitations(nodeID)
	if err != nil {
		return err
	}
	for _, inv := range invs {
		if inv.SpentAt == nil && inv.TokenHash != keep {
			if err := tx.DeleteInvitation(inv.TokenHash); err != nil {
				return err
			}
		}
	}
	return nil
}

// listInvitations lists a node's invitations, oldest first, by an ID that
// is a prefix of the stored hash (never the token).
func (s *Server) listInvitations(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	out := api.InvitationList{Invitations: []api.InvitationInfo{}}
	now := s.now()
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		if _, err := tx.GetNode(id); err != nil {
			return err
		}
		invs, err := tx.ListInvitations(id)
		for _, inv := range invs {
			status := "unused"
			switch {
			case inv.SpentAt != nil:
				status = "spent"
			case !inv.ExpiresAt.After(now):
				status = "expired"
			}
			out.Invitations = append(out.Invitations, api.InvitationInfo{ID: inv.TokenHash[:min(12, len(inv.TokenHash))], NodeID: inv.NodeID,
				CreatedAt: inv.CreatedAt, ExpiresAt: inv.ExpiresAt, SpentAt: inv.SpentAt, Status: status})
		}
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// retireSessions, in a renewal's transaction, leaves the node exactly two
// valid session credentials: the new one, and the caller's, cut to
// renewOverlap. Every other session of the node is deleted.
func retireSessions(tx store.Tx, caller store.Session, renewed store.Session, now time.Time) error {
	if err := tx.DeleteSessions(caller.NodeID); err != nil {
		return err
	}
	if end := now.Add(renewOverlap); caller.ExpiresAt.After(end) {
		caller.ExpiresAt = end
	}
	if err := tx.PutSession(caller); err != nil {
		return err
	}
	return tx.PutSession(renewed)
}
