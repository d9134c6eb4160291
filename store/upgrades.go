package store

import "time"

// UpgradeTx is the part of Tx that holds agent releases and their
// rollouts (docs/upgrades.md).
type UpgradeTx interface {
	// CreateAgentRelease stores a release; ErrConflict if its version and
	// platform exist. Releases are immutable: there is no Put.
	CreateAgentRelease(r AgentRelease) error
	// GetAgentRelease returns one release; ErrNotFound if there is none.
	GetAgentRelease(version, platform string) (AgentRelease, error)
	// ListAgentReleases returns every release ordered by version, then
	// platform.
	ListAgentReleases() ([]AgentRelease, error)
	// DeleteAgentRelease removes a release; ErrNotFound if there is none.
	DeleteAgentRelease(version, platform string) error

	// PutRollout creates or replaces a rollout.
	PutRollout(r Rollout) error
	// GetRollout returns one rollout; ErrNotFound if there is none.
	GetRollout(id string) (Rollout, error)
	// ListRollouts returns every rollout, newest first (by CreatedAt, then
	// ID).
	ListRollouts() ([]Rollout, error)
	// DeleteRollout removes a rollout; ErrNotFound if there is none.
	DeleteRollout(id string) error
}

// AgentRelease is one agent binary the control plane stores, its bytes in
// the content store under SHA256. Retention: kept until `mercator
// agent-release rm`, which refuses a release a running rollout uses.
type AgentRelease struct {
	Version  string `json:"version"`
	Platform string `json:"platform"`
	SHA256   string `json:"sha256"`
	Size     int64  `json:"size"`
	// Signature is the Ed25519 signature of the bytes, checked against
	// the server's release key when it has one; empty otherwise.
	Signature []byte    `json:"signature,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Rollout states.
const (
	RolloutRunning   = "running"
	RolloutSucceeded = "succeeded"
	RolloutStopped   = "stopped"
)

// Rollout node states.
const (
	RolloutNodePending  = "pending"
	RolloutNodeSent     = "sent"
	RolloutNodeUpgraded = "upgraded"
	RolloutNodeFailed   = "failed"
)

// Rollout is one upgrade of a set of nodes to one release: the first
// Canary nodes alone, then the rest MaxParallel at a time, stopped at the
// first failure. Retention: a finished rollout is kept until KeepRollouts
// newer ones exist (the control plane deletes the oldest as it creates one).
type Rollout struct {
	ID          string        `json:"id"`
	Version     string        `json:"version"`
	Platform    string        `json:"platform"`
	Canary      int           `json:"canary"`
	MaxParallel int           `json:"max_parallel"`
	Deadline    time.Duration `json:"deadline_ns"`
	State       string        `json:"state"`
	Reason      string        `json:"reason,omitempty"`
	Nodes       []RolloutNode `json:"nodes"`
	CreatedAt   time.Time     `json:"created_at"`
	UpdatedAt   time.Time     `json:"updated_at"`
}

// KeepRollouts is how many rollouts are kept (the newest).
const KeepRollouts = 50

// RolloutNode is one node's part in a rollout.
type RolloutNode struct {
	ID          string     `json:"id"`
	State       string     `json:"state"`
	OperationID string     `json:"operation_id,omitempty"`
	SentAt      *time.Time `json:"sent_at,omitempty"`
	Error       string     `json:"error,omitempty"`
}
