package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/mercator/mercator/api"
)

// CreateToken mints a named API credential (POST /v1/tokens); the answer
// holds its secret, shown this once. Admin only.
func (c *Client) CreateToken(ctx context.Context, req api.TokenRequest) (api.TokenCreated, error) {
	var out api.TokenCreated
	if err := c.do(ctx, http.MethodPost, "/tokens", nil, req, &out); err != nil {
		return api.TokenCreated{}, fmt.Errorf("create token %s: %w", req.Name, err)
	}
	return out, nil
}

// ListTokens lists the named credentials, never their secrets (GET
// /v1/tokens). Admin only.
func (c *Client) ListTokens(ctx context.Context) (api.TokenList, error) {
	var out api.TokenList
	if err := c.do(ctx, http.MethodGet, "/tokens", nil, nil, &out); err != nil {
		return api.TokenList{}, fmt.Errorf("list tokens: %w", err)
	}
	if out.Tokens == nil {
		out.Tokens = []api.Token{}
	}
	return out, nil
}

// RemoveToken removes a named credential (DELETE /v1/tokens/{name}): it is
// refused at once, on every replica. The last admin credential cannot be
// removed (failure.ErrConflict).
func (c *Client) RemoveToken(ctx context.Context, name string) error {
	if err := c.do(ctx, http.MethodDelete, "/tokens/"+url.PathEscape(name), nil, nil, nil); err != nil {
		return fmt.Errorf("remove token %s: %w", name, err)
	}
	return nil
}

// AuditOptions filters ListAudit; zero values mean no filter.
type AuditOptions struct {
	Since time.Time
	Who   string
	Limit int
}

// ListAudit returns audit entries, newest first (GET /v1/audit). Admin only.
func (c *Client) ListAudit(ctx context.Context, opts AuditOptions) (api.AuditList, error) {
	q := url.Values{}
	if !opts.Since.IsZero() {
		q.Set("since", opts.Since.UTC().Format(time.RFC3339Nano))
	}
	if opts.Who != "" {
		q.Set("who", opts.Who)
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	var out api.AuditList
	if err := c.do(ctx, http.MethodGet, "/audit", q, nil, &out); err != nil {
		return api.AuditList{}, fmt.Errorf("list audit entries: %w", err)
	}
	if out.Entries == nil {
		out.Entries = []api.AuditEntry{}
	}
	return out, nil
}

// RemoveNode removes a node (DELETE /v1/nodes/{id}): its sessions and
// unused invitations end at once, its agent stops, and its work is treated
// as on an unreachable node.
func (c *Client) RemoveNode(ctx context.Context, nodeID string) (api.Node, error) {
	var node api.Node
	if err := c.do(ctx, http.MethodDelete, "/nodes/"+url.PathEscape(nodeID), nil, nil, &node); err != nil {
		return api.Node{}, fmt.Errorf("remove node %s: %w", nodeID, err)
	}
	return node, nil
}

// ListInvitations lists a node's invitations, oldest first, never their
// tokens (GET /v1/nodes/{id}/invitations).
func (c *Client) ListInvitations(ctx context.Context, nodeID string) (api.InvitationList, error) {
	var out api.InvitationList
	if err := c.do(ctx, http.MethodGet, "/nodes/"+url.PathEscape(nodeID)+"/invitations", nil, nil, &out); err != nil {
		return api.InvitationList{}, fmt.Errorf("list invitations of node %s: %w", nodeID, err)
	}
	if out.Invitations == nil {
		out.Invitations = []api.InvitationInfo{}
	}
	return out, nil
}
