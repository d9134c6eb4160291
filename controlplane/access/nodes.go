package access

import (
	"net/http"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/store"
)

// RevokeUnused deletes the node's invitations that were never spent, but
// keep (a new one's hash).
func RevokeUnused(tx store.Tx, nodeID, keep string) error {
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
func (s *Service) listInvitations(w http.ResponseWriter, r *http.Request) {
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

// RetireSessions, in a renewal's transaction, leaves the node exactly two
// valid session credentials: the new one, and the caller's, cut to
// RenewOverlap. Every other session of the node is deleted.
func RetireSessions(tx store.Tx, caller store.Session, renewed store.Session, now time.Time) error {
	if err := tx.DeleteSessions(caller.NodeID); err != nil {
		return err
	}
	if end := now.Add(RenewOverlap); caller.ExpiresAt.After(end) {
		caller.ExpiresAt = end
	}
	if err := tx.PutSession(caller); err != nil {
		return err
	}
	return tx.PutSession(renewed)
}
