// Package access holds who may call the control plane, beyond the
// per-request check every route gets (internal/httpapi's Tokens and the
// access table in package controlplane's routes.go): the admin's routes for
// named API credentials (/v1/tokens) and the audit log (/v1/audit), the
// listing of a node's invitations, and the store rules that revoke node
// credentials: a new invitation voids the unused ones (RevokeUnused), and a
// renewal retires the session credential it replaces (RetireSessions).
//
// Only package controlplane may import it.
package access

import (
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// Service serves the access routes.
type Service struct {
	store   store.Store
	now     func() time.Time
	removed func(hash string)
}

// New returns the access routes' service. removed is told the hash of every
// token removed here, to be refused at once on every replica.
func New(st store.Store, now func() time.Time, removed func(hash string)) *Service {
	return &Service{store: st, now: now, removed: removed}
}

// Routes are the access routes, each served behind an API credential.
func (s *Service) Routes() []httpapi.Route {
	return []httpapi.Route{
		{Pattern: "GET /v1/nodes/{id}/invitations", Handler: s.listInvitations},
		{Pattern: "POST /v1/tokens", Handler: s.createToken},
		{Pattern: "GET /v1/tokens", Handler: s.listTokens},
		{Pattern: "DELETE /v1/tokens/{name}", Handler: s.removeToken},
		{Pattern: "GET /v1/audit", Handler: s.listAudit},
	}
}

// NewSecret returns a fresh API credential (prefix mca_).
func NewSecret() string { return "mca_" + httpapi.RandomToken() }

// namePattern is a token's name: as a node ID, safe in a URL path and a
// table cell.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// RenewOverlap is how long the credential a renewal replaces stays valid:
// enough for calls already in flight with it, so that at most two of a
// node's session credentials are ever valid, and the older only briefly.
const RenewOverlap = time.Minute

// maxTokenLife bounds --expires: ten years, past which "never" is the
// honest answer.
const maxTokenLife = 10 * 365 * 24 * time.Hour

func tokenView(t store.Token) api.Token {
	return api.Token{Name: t.Name, Role: string(httpapi.RoleOf(t)), App: t.App, Projects: t.Projects, CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, LastUsedAt: t.LastUsedAt}
}

// createToken mints a named credential with a role and shows its secret,
// once.
func (s *Service) createToken(w http.ResponseWriter, r *http.Request) {
	var req api.TokenRequest
	if err := httpapi.Decode(r, httpapi.MaxBody, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	role, err := httpapi.ParseRole(req.Role)
	switch {
	case err != nil:
	case !namePattern.MatchString(req.Name):
		err = failure.Invalid("name", "%q is not a valid token name: use 1 to 63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit", req.Name)
	case role == httpapi.RoleInvoker && req.App == "":
		err = failure.Invalid("app", "an invoker key needs the app it may call (--app APP)")
	case role != httpapi.RoleInvoker && req.App != "":
		err = failure.Invalid("app", "only an invoker key is confined to an app; a %s token may not name one", role)
	case req.ExpiresSeconds < 0 || time.Duration(req.ExpiresSeconds)*time.Second > maxTokenLife:
		err = failure.Invalid("expires_seconds", "must be from 1 second to 10 years, or 0 for a token that never expires")
	case len(req.Projects) > 0 && (role == httpapi.RoleAdmin || role == httpapi.RoleInvoker):
		err = failure.Invalid("projects", "a %s token cannot be confined to projects; give a reader, submitter or operator role", role)
	case len(req.Projects) > api.MaxProjectGPUModels:
		err = failure.Invalid("projects", "%d projects; at most %d", len(req.Projects), api.MaxProjectGPUModels)
	}
	for _, p := range req.Projects {
		if err == nil {
			err = api.ValidateProjectName("projects", p)
		}
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	now := s.now()
	secret := NewSecret()
	t := store.Token{Hash: httpapi.HashToken(secret), Name: req.Name, Role: string(role), App: req.App, Projects: req.Projects, CreatedAt: now}
	if req.ExpiresSeconds > 0 {
		exp := now.Add(time.Duration(req.ExpiresSeconds) * time.Second)
		t.ExpiresAt = &exp
	}
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		if _, err := tokenNamed(tx, req.Name); err == nil {
			return failure.Conflict("a token named %q exists; remove it first (`mercator token rm %s`) or choose another name", req.Name, req.Name)
		} else if !failureIsNotFound(err) {
			return err
		}
		for _, p := range req.Projects {
			if err := project.Exists(tx, "projects", p); err != nil {
				return err
			}
		}
		return tx.CreateToken(t)
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusCreated, api.TokenCreated{Token: tokenView(t), Secret: secret})
}

func failureIsNotFound(err error) bool { return errors.Is(err, failure.ErrNotFound) }

// tokenNamed is the token of that name; ErrNotFound if none.
func tokenNamed(tx store.Tx, name string) (store.Token, error) {
	toks, err := tx.ListTokens()
	if err != nil {
		return store.Token{}, err
	}
	for _, t := range toks {
		if t.Name == name {
			return t, nil
		}
	}
	return store.Token{}, failure.NotFound("token", name)
}

func (s *Service) listTokens(w http.ResponseWriter, r *http.Request) {
	out := api.TokenList{Tokens: []api.Token{}}
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		toks, err := tx.ListTokens()
		for _, t := range toks {
			out.Tokens = append(out.Tokens, tokenView(t))
		}
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// removeToken deletes a credential, refused at once on every replica: this
// one forgets it now, the others when the signal arrives (and within the
// cache's one second if it is lost). The last admin credential is kept,
// or nobody could manage tokens again.
func (s *Service) removeToken(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var gone store.Token
	err := s.store.Update(r.Context(), func(tx store.Tx) error {
		t, err := tokenNamed(tx, name)
		if err != nil {
			return err
		}
		if httpapi.RoleOf(t) == httpapi.RoleAdmin {
			toks, err := tx.ListTokens()
			if err != nil {
				return err
			}
			admins := 0
			for _, o := range toks {
				if httpapi.RoleOf(o) == httpapi.RoleAdmin && (o.ExpiresAt == nil || o.ExpiresAt.After(s.now())) {
					admins++
				}
			}
			if admins <= 1 {
				return failure.Conflict("%q is the last admin credential; create another (`mercator token create NAME --role admin`) before removing it", name)
			}
		}
		gone = t
		return tx.DeleteToken(t.Hash)
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.removed(gone.Hash)
	w.WriteHeader(http.StatusNoContent)
}

// listAudit answers the audit log, newest first: ?since=RFC3339, ?who=NAME,
// ?limit=N (default 1000, at most 10000).
func (s *Service) listAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := store.ListAuditOptions{Who: q.Get("who"), Limit: 1000}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			httpapi.WriteError(w, failure.Invalid("since", "%q is not an RFC 3339 time", v))
			return
		}
		opts.Since = t
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			httpapi.WriteError(w, failure.Invalid("limit", "must be from 1 to 10000"))
			return
		}
		opts.Limit = n
	}
	out := api.AuditList{Entries: []api.AuditEntry{}}
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		entries, err := tx.ListAudit(opts)
		for _, e := range entries {
			out.Entries = append(out.Entries, api.AuditEntry(e))
		}
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}
