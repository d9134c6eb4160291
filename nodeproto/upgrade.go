package nodeproto

// This file holds the self-upgrade command (capability version
// VersionUpgrade).

import "time"

// KindUpgradeAgent asks the agent to replace its own binary with a release
// the control plane stores (UpgradeAgentCommand). It is an operation like a
// launch: stored, redelivered until a result comes back. The result comes
// from whichever binary runs when the upgrade settles: the new one ("ok",
// it runs Version) or the previous one restored ("failed", with the reason).
const KindUpgradeAgent = "upgrade_agent"

// UpgradeAgentCommand names one agent release and where to fetch it. As
// with PrepareArtifactCommand, the control plane stores it without URL and
// ExpiresAt and mints them each time it sends it.
type UpgradeAgentCommand struct {
	// Version is the release's agent version; an agent already running it
	// answers "ok" without fetching anything (a command redelivered to the
	// new binary after the re-exec).
	Version  string `json:"version"`
	Platform string `json:"platform"`
	SHA256   string `json:"sha256"`
	Size     int64  `json:"size"`
	// Signature is the Ed25519 signature of the binary's bytes, and
	// PublicKey the key the control plane checked it with (both empty
	// when the control plane has no release key). The agent checks the
	// signature again before it runs anything.
	Signature []byte `json:"signature,omitempty"`
	PublicKey []byte `json:"public_key,omitempty"`
	// Deadline is how long the new binary has to come back connected and
	// take this command again before the previous one is restored; zero
	// means the agent's default.
	Deadline  time.Duration `json:"deadline_ns,omitempty"`
	URL       string        `json:"url,omitempty"`
	ExpiresAt time.Time     `json:"expires_at,omitzero"`
}
