package api

import "time"

// Agent releases and rollouts (docs/upgrades.md).

// HeaderReleaseSignature carries a pushed release's Ed25519 signature, in
// base64, on POST /v1/agent-releases.
const HeaderReleaseSignature = "Mercator-Release-Signature"

// AgentRelease is one agent binary the control plane stores.
type AgentRelease struct {
	Version   string    `json:"version"`
	Platform  string    `json:"platform"`
	SHA256    string    `json:"sha256"`
	Size      int64     `json:"size"`
	Signed    bool      `json:"signed"`
	CreatedAt time.Time `json:"created_at"`
}

// AgentReleaseList is GET /v1/agent-releases.
type AgentReleaseList struct {
	Releases []AgentRelease `json:"releases"`
}

// RolloutRequest is POST /v1/rollouts: upgrade Nodes (or All ready nodes)
// to Version (default: the newest release for the platform).
type RolloutRequest struct {
	Nodes    []string `json:"nodes,omitempty"`
	All      bool     `json:"all,omitempty"`
	Version  string   `json:"version,omitempty"`
	Platform string   `json:"platform,omitempty"`
	// MaxParallel nodes in flight at once (default 1); Canary nodes go
	// first, alone (default 1).
	MaxParallel int  `json:"max_parallel,omitempty"`
	Canary      *int `json:"canary,omitempty"`
	// DeadlineSeconds is how long each new agent has to come back
	// connected before it rolls back (default 120).
	DeadlineSeconds int `json:"deadline_seconds,omitempty"`
}

// Rollout states and node states.
const (
	RolloutRunning   = "running"
	RolloutSucceeded = "succeeded"
	RolloutStopped   = "stopped"
)

// Rollout is one upgrade of a set of nodes to one release.
type Rollout struct {
	ID          string        `json:"id"`
	Version     string        `json:"version"`
	Platform    string        `json:"platform"`
	Canary      int           `json:"canary"`
	MaxParallel int           `json:"max_parallel"`
	State       string        `json:"state"`
	Reason      string        `json:"reason,omitempty"`
	Nodes       []RolloutNode `json:"nodes"`
	CreatedAt   time.Time     `json:"created_at"`
	UpdatedAt   time.Time     `json:"updated_at"`
}

// RolloutNode is one node's part: pending, sent, upgraded or failed.
type RolloutNode struct {
	ID     string     `json:"id"`
	State  string     `json:"state"`
	SentAt *time.Time `json:"sent_at,omitempty"`
	Error  string     `json:"error,omitempty"`
}

// RolloutList is GET /v1/rollouts, newest first.
type RolloutList struct {
	Rollouts []Rollout `json:"rollouts"`
}
