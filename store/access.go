package store

import "time"

// AccessTx is the part of Tx that holds who may call the API and what they
// did: named API credentials and the audit log.
type AccessTx interface {
	// CreateToken stores an API credential; ErrConflict if the hash exists.
	// Names are unique too, but that is the caller's rule (it lists the
	// tokens in the same transaction), not an index's.
	CreateToken(t Token) error
	GetToken(hash string) (Token, error)
	// PutToken replaces an existing token (its last use); ErrNotFound if it
	// was deleted meanwhile, so a late write never brings one back.
	PutToken(t Token) error
	// ListTokens returns every token ordered by name, then hash.
	ListTokens() ([]Token, error)
	// DeleteToken removes a token; ErrNotFound if there is none.
	DeleteToken(hash string) error

	// AppendAudit adds entries to the audit log; ErrConflict if an ID
	// exists.
	AppendAudit(entries []AuditEntry) error
	// ListAudit returns entries newest first (by At, then ID).
	ListAudit(opts ListAuditOptions) ([]AuditEntry, error)
	// PruneAudit deletes entries older than before and, of the rest, all
	// but the newest keep (keep 0: no cap), and reports how many it
	// deleted. This is the audit log's retention rule.
	PruneAudit(before time.Time, keep int) (int, error)
}

// Token is an API credential, stored by hash only. Retention: a token lives
// until `mercator token rm`; past ExpiresAt it is refused, and listed as
// expired until removed (the admin decides, so a name is never reused
// behind their back).
type Token struct {
	Hash string `json:"hash"`
	Name string `json:"name"`
	// Role is reader, submitter, operator, admin or invoker; empty in a
	// token stored before roles existed, which was the admin credential
	// and reads as admin.
	Role string `json:"role,omitempty"`
	// App is the app an invoker may call, by name.
	App string `json:"app,omitempty"`
	// Projects, when set, confine the token to those projects' runs and
	// records (docs/teams.md); empty is every project.
	Projects   []string   `json:"projects,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
}

// AuditEntry is one recorded call: a mutating call, or a refused
// credential. It never holds a secret or a request body.
type AuditEntry struct {
	ID string    `json:"id"`
	At time.Time `json:"at"`
	// Who is the token's name, "node:ID" for a node, or "" when no valid
	// credential was presented.
	Who    string `json:"who,omitempty"`
	Role   string `json:"role,omitempty"`
	Remote string `json:"remote,omitempty"`
	Method string `json:"method"`
	// Route is the route's pattern; Object the ID the path names, if any.
	Route  string `json:"route"`
	Object string `json:"object,omitempty"`
	Status int    `json:"status"`
	// Detail says what a call changed where that matters to an audit
	// beyond its route, e.g. "public invoke on" for an app opened to
	// callers without a credential.
	Detail string `json:"detail,omitempty"`
}

// ListAuditOptions filters ListAudit. Zero values mean no filter; Limit 0
// means no limit.
type ListAuditOptions struct {
	Since time.Time
	Who   string
	Limit int
}
