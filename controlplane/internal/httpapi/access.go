package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/controlplane/internal/expiring"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// Role is what an API credential may do. The four ranked roles each allow
// what the one below allows and more: reader (every GET but secrets),
// submitter (+ runs, Artifact pushes, function invocation), operator (+
// nodes, invitations, registries, apps, fns and triggers), admin (+
// tokens and the audit log). An invoker is outside the ranks: it may call
// one app's functions and triggers and nothing else.
type Role string

// The roles.
const (
	RoleReader    Role = "reader"
	RoleSubmitter Role = "submitter"
	RoleOperator  Role = "operator"
	RoleAdmin     Role = "admin"
	RoleInvoker   Role = "invoker"
)

// Roles lists every role, ranked ones in rank order, then invoker.
var Roles = []Role{RoleReader, RoleSubmitter, RoleOperator, RoleAdmin, RoleInvoker}

var rank = map[Role]int{RoleReader: 1, RoleSubmitter: 2, RoleOperator: 3, RoleAdmin: 4}

// ParseRole checks a role's name.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", failure.Invalid("role", "unknown role %q: use reader, submitter, operator, admin or invoker", s)
}

// RoleOf is a stored token's role: a token stored before roles existed
// was the admin credential.
func RoleOf(t store.Token) Role {
	if t.Role == "" {
		return RoleAdmin
	}
	return Role(t.Role)
}

// Access is who may call a route: Role and every role above it; with
// Invoker, also an invoker key, which the handler confines to its app;
// with Public, also a caller without a credential, whom the handler lets
// through only where the object allows it (a public trigger).
type Access struct {
	Role    Role
	Invoker bool
	Public  bool
}

// Allows reports whether a caller of role r may call a route with access a.
func (a Access) Allows(r Role) bool {
	if r == RoleInvoker {
		return a.Invoker
	}
	return rank[r] >= rank[a.Role]
}

// Caller is who made a public-API request, as its credential proved. Name
// is empty for a caller without a credential (Access.Public).
type Caller struct {
	Name string
	Role Role
	App  string // an invoker's app
	// Projects confine the caller to those projects; nil is every one.
	Projects []string
}

type callerKey struct{}

// CallerOf is the request's caller; false when the route is not behind
// Tokens.Require.
func CallerOf(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// ConfineToApp refuses a call into app by an invoker of another app, or
// by a caller without a credential unless public: the check a route with
// Access.Invoker or Access.Public leaves to its handler, which knows the
// app the call addresses.
func ConfineToApp(ctx context.Context, app string, public bool, action string) error {
	c, ok := CallerOf(ctx)
	switch {
	case !ok || (c.Role != RoleInvoker && c.Name != ""):
		return nil
	case c.Name == "" && !public:
		return failure.Unauthorized("%s needs a credential: send `Authorization: Bearer <token>` (the app is not open to public invoke: mercator app update APP --public-invoke)", action)
	case c.Role == RoleInvoker && c.App != app:
		return failure.Forbidden("invoker of app %q may not %s of app %q; it needs submitter", c.App, action, app)
	}
	return nil
}

// tokenTTL is how long a token record read from the store is used: the
// longest a token removed on another replica keeps working if the removal's
// signal is lost (the signal makes it at once); one read a second per token
// per replica on the invocation path costs nothing that matters.
const tokenTTL = time.Second

// lastUseEvery is how stale a token's recorded last use may be: at most
// one write a minute per token, whatever its call rate.
const lastUseEvery = time.Minute

// Tokens authenticates API credentials for every public route, and
// enforces their roles. It caches token records for tokenTTL; Forget drops
// one at once (token rm, here or on another replica). The zero value is not
// usable: set Store and Now. Safe for concurrent use.
type Tokens struct {
	Store store.Store
	Now   func() time.Time

	cache expiring.Map[store.Token]
	bumps sync.Map // hash → time.Time of this replica's last last-use write
}

// Forget drops the cached record of a token's hash.
func (a *Tokens) Forget(hash string) { a.cache.Forget(hash) }

// Check returns the caller tok proves: failure.ErrUnauthorized for an
// unknown or expired credential.
func (a *Tokens) Check(ctx context.Context, tok string) (Caller, error) {
	hash := HashToken(tok)
	now := a.Now()
	t, fresh, gen := a.cache.Get(hash, now, tokenTTL)
	if !fresh {
		err := a.Store.View(ctx, func(tx store.Tx) error { var err error; t, err = tx.GetToken(hash); return err })
		if errors.Is(err, failure.ErrNotFound) {
			return Caller{}, failure.Unauthorized("the credential is not valid for this control plane (unknown or removed)")
		}
		if err != nil {
			return Caller{}, err
		}
		a.cache.Put(hash, t, gen, now)
	}
	if t.ExpiresAt != nil && !now.Before(*t.ExpiresAt) {
		return Caller{}, failure.Unauthorized("the credential %q expired at %s", t.Name, t.ExpiresAt.UTC().Format(time.RFC3339))
	}
	a.noteUse(t, now)
	return Caller{Name: t.Name, Role: RoleOf(t), App: t.App, Projects: t.Projects}, nil
}

// noteUse records the token's last use, at most once every lastUseEvery,
// off the request's path.
func (a *Tokens) noteUse(t store.Token, now time.Time) {
	if t.LastUsedAt != nil && now.Sub(*t.LastUsedAt) < lastUseEvery {
		return
	}
	if v, ok := a.bumps.Load(t.Hash); ok && now.Sub(v.(time.Time)) < lastUseEvery {
		return
	}
	a.bumps.Store(t.Hash, now)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Store.Update(ctx, func(tx store.Tx) error {
			cur, err := tx.GetToken(t.Hash)
			if err != nil {
				return err // removed meanwhile: nothing to record
			}
			cur.LastUsedAt = &now
			return tx.PutToken(cur)
		})
	}()
}

// Require wraps h to require a credential that route.Access allows; fail
// writes a refusal in the shape of the route's API (the /v1 error, or
// Fn's). A refusal of a valid credential is failure.ErrForbidden, whose
// message names the role that would do.
func (a *Tokens) Require(route Route, h http.Handler, fail func(http.ResponseWriter, *http.Request, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuse := func(_ Caller, err error) { fail(w, r, err) }
		tok, ok := Bearer(r)
		if !ok {
			if route.Access.Public {
				h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, Caller{})))
				return
			}
			refuse(Caller{}, failure.Unauthorized("this API needs a credential: send `Authorization: Bearer <token>` (the CLI reads MERCATOR_TOKEN or --token-file)"))
			return
		}
		c, err := a.Check(r.Context(), tok)
		if err != nil {
			refuse(Caller{}, err)
			return
		}
		NoteWho(r.Context(), c.Name, string(c.Role)) // for the audit log
		if !route.Access.Allows(c.Role) {
			refuse(c, failure.Forbidden("%s may not %s; it needs %s", c.Role, route.Pattern, route.Access.Role))
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	})
}

// Describe is a role's one-line description, as `token ls` and the docs say it.
func Describe(r Role) string {
	switch r {
	case RoleReader:
		return "every GET except secrets"
	case RoleSubmitter:
		return "reader + runs, Artifact pushes, function invocation"
	case RoleOperator:
		return "submitter + nodes, invitations, registries, apps, fns and triggers"
	case RoleAdmin:
		return "everything, tokens and the audit log included"
	case RoleInvoker:
		return "one app's functions and triggers, nothing else"
	}
	return fmt.Sprintf("unknown role %q", string(r))
}

// ProjectScope is the projects the request's caller is confined to; nil
// means every project (an unscoped credential, or a route not behind
// Tokens.Require).
func ProjectScope(ctx context.Context) []string {
	c, _ := CallerOf(ctx)
	return c.Projects
}

// ConfineToProject refuses action on project by a credential confined to
// other projects (docs/teams.md).
func ConfineToProject(ctx context.Context, project, action string) error {
	scope := ProjectScope(ctx)
	if scope == nil || slices.Contains(scope, project) {
		return nil
	}
	c, _ := CallerOf(ctx)
	return failure.Forbidden("token %q is confined to project(s) %s and may not %s of project %q", c.Name, strings.Join(scope, ", "), action, project)
}
