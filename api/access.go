package api

import "time"

// TokenRequest is the body of POST /v1/tokens: a named API credential with
// a role (reader, submitter, operator, admin, or invoker with App).
type TokenRequest struct {
	Name string `json:"name"`
	Role string `json:"role"`
	// App is the app an invoker may call, by name; only for role invoker.
	App string `json:"app,omitempty"`
	// ExpiresSeconds is the credential's life; 0 means it never expires.
	ExpiresSeconds int64 `json:"expires_seconds,omitempty"`
	// Projects, when set, confine the credential to those projects: it
	// sees and touches only their runs and records (not for admin or
	// invoker tokens). Empty is every project.
	Projects []string `json:"projects,omitempty"`
}

// Token is a named API credential as listed: never its secret.
type Token struct {
	Name       string     `json:"name"`
	Role       string     `json:"role"`
	App        string     `json:"app,omitempty"`
	Projects   []string   `json:"projects,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
}

// TokenCreated is the answer to POST /v1/tokens: the only time the secret
// is shown.
type TokenCreated struct {
	Token
	Secret string `json:"token"`
}

// TokenList is the body of GET /v1/tokens, ordered by name.
type TokenList struct {
	Tokens []Token `json:"tokens"`
}

// AuditEntry is one recorded call: a mutating call or a refused
// credential. It holds no secret and no body.
type AuditEntry struct {
	ID string    `json:"id"`
	At time.Time `json:"at"`
	// Who is a token's name, "node:ID", or empty for a caller without a
	// valid credential.
	Who    string `json:"who,omitempty"`
	Role   string `json:"role,omitempty"`
	Remote string `json:"remote,omitempty"`
	Method string `json:"method"`
	Route  string `json:"route"`
	Object string `json:"object,omitempty"`
	Status int    `json:"status"`
	// Detail says what a call changed where that matters to an audit
	// beyond its route, e.g. "public invoke on" for an app opened to
	// callers without a credential.
	Detail string `json:"detail,omitempty"`
}

// AuditList is the body of GET /v1/audit, newest first.
type AuditList struct {
	Entries []AuditEntry `json:"entries"`
}

// InvitationInfo is a node's invitation as listed: its ID is a prefix of
// the stored hash, never the token.
type InvitationInfo struct {
	ID        string     `json:"id"`
	NodeID    string     `json:"node_id"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	SpentAt   *time.Time `json:"spent_at,omitempty"`
	// Status is unused, spent or expired.
	Status string `json:"status"`
}

// InvitationList is the body of GET /v1/nodes/{id}/invitations, oldest
// first.
type InvitationList struct {
	Invitations []InvitationInfo `json:"invitations"`
}
