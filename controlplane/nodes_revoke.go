package controlplane

import (
	"net/http"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/access"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/store"
)

// Revocation of node credentials: `mercator node rm` (removeNode). The other revocations are store rules in
// package access: the invitations a new one supersedes (RevokeUnused, from
// inviteNode) and the session credential a renewal retires
// (RetireSessions, from renew).

// removeNode ends a node's sessions and unused invitations at once and
// fences it: its fencing token rises, so every command and event of the
// old enrollment is refused; its agent's next call is answered with
// removedError, on which the agent stops; and its work is treated as on an
// unreachable node from now (placement.LostSince). The record stays,
// marked removed, so its runs keep naming a node that exists;
// `mercator node invite` brings it back.
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
		if err := access.RevokeUnused(tx, id, ""); err != nil {
			return err
		}
		out = s.nodeView(n, nodeWork{}, now)
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
