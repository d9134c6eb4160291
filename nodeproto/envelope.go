package nodeproto

// This file holds the envelopes: a Command the control plane sends down a
// node's session, an Event a node reports, and the Result of one operation.

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Command kinds.
const (
	KindPrepareImage    = "prepare_image"
	KindPrepareArtifact = "prepare_artifact"
	KindLaunchWorkload  = "launch_workload"
	KindStopWorkload    = "stop_workload"
	// KindInvoke is one function call (InvokeCommand). It is
	// ephemeral: never stored, never redelivered, no result event; the
	// call's outcome travels over the agent's own requests to the calls
	// paths. It carries no OperationID.
	KindInvoke = "invoke"
	// KindCallLog asks for the log a node keeps of one call
	// (CallLogCommand, capability version 4). Ephemeral like
	// KindInvoke: no OperationID, the answer travels over the agent's own
	// request.
	KindCallLog = "call_log"
	// KindHold asks the node to prefetch a function's image and keep some
	// of its containers started (HoldCommand, capability version 6).
	// Ephemeral like KindInvoke: no OperationID, no result; the control
	// plane repeats it while it wants the containers held.
	KindHold = "hold"
	// KindKeepAlive carries nothing; it keeps idle proxies from closing the
	// session stream and lets the agent notice a dead one.
	KindKeepAlive = "keep_alive"
)

// Command is one operation for one node. OperationID is unique and stable
// across redeliveries; FencingToken is the enrollment it was issued under.
// Exactly one payload field is set, the one Kind names.
//
// CreatedAt is when the control plane created the operation, by its clock,
// and stays the same on every redelivery. It is informational (the agent
// decides nothing on it, so an agent that ignores it loses nothing): it is
// what lets a node, or the fleet simulator, measure how long a command took
// to arrive.
type Command struct {
	OperationID     string                  `json:"operation_id,omitempty"`
	FencingToken    uint64                  `json:"fencing_token,omitempty"`
	Kind            string                  `json:"kind"`
	CreatedAt       time.Time               `json:"created_at,omitzero"`
	PrepareImage    *PrepareImageCommand    `json:"prepare_image,omitempty"`
	PrepareArtifact *PrepareArtifactCommand `json:"prepare_artifact,omitempty"`
	LaunchWorkload  *LaunchWorkloadCommand  `json:"launch_workload,omitempty"`
	StopWorkload    *StopWorkloadCommand    `json:"stop_workload,omitempty"`
	Invoke          *InvokeCommand          `json:"invoke,omitempty"`
	CallLog         *CallLogCommand         `json:"call_log,omitempty"`
	Hold            *HoldCommand            `json:"hold,omitempty"`
	// UpgradeAgent: capability version VersionUpgrade (upgrade.go).
	UpgradeAgent *UpgradeAgentCommand `json:"upgrade_agent,omitempty"`
}

// RequiredVersion is the lowest capability version whose agents can carry
// out c: VersionArtifacts for prepare_artifact and for a launch
// that mounts Artifacts, VersionFunctions for invoke, VersionCallLogs for
// call_log, VersionHardening for a launch with secrets or one that asks for
// containment (LaunchWorkloadCommand.AsksContainment), and 1 (every agent)
// for the rest. An older agent would fail the command, or take an unknown kind for
// an operation it must report on, so the control plane sends a command only
// to a node at this version or later, and a Run whose launch needs more
// than a node speaks waits, with a reason, rather than go there.
func RequiredVersion(c Command) int {
	switch c.Kind {
	case KindPrepareArtifact:
		return VersionArtifacts
	case KindLaunchWorkload:
		switch l := c.LaunchWorkload; {
		case l == nil:
		case l.Network == NetworkHost && l.GangSize > 1:
			return VersionGang
		case len(l.SecretNames) > 0 || len(l.Secrets) > 0 || l.AsksContainment():
			return VersionHardening
		case len(l.Artifacts) > 0:
			return VersionArtifacts
		}
	case KindInvoke:
		return VersionFunctions
	case KindCallLog:
		return VersionCallLogs
	case KindHold:
		return VersionWarmCapacity
	case KindUpgradeAgent:
		return VersionUpgrade
	}
	return 1
}

// Result outcomes.
const (
	OutcomeOK      = "ok"
	OutcomeFailed  = "failed"
	OutcomeRefused = "refused" // fenced below the node's token, or otherwise not attempted
)

// Result is the outcome of one operation.
type Result struct {
	OperationID  string    `json:"operation_id"`
	FencingToken uint64    `json:"fencing_token"`
	Kind         string    `json:"kind"`
	Outcome      string    `json:"outcome"`
	Error        string    `json:"error,omitempty"`
	At           time.Time `json:"at"`
	// Workload is set for launch and stop results.
	Workload *WorkloadKey `json:"workload,omitempty"`
}

// Event kinds.
const (
	EventWorkload = "workload"
	EventFacts    = "facts"
	EventResult   = "result"
)

// Event is one fact a node owes the control plane. ID is minted by the node
// (State.NextEventID): stable across redeliveries and monotonic within one
// state file, so the control plane deduplicates by (node, ID).
type Event struct {
	ID       string               `json:"id"`
	Kind     string               `json:"kind"`
	At       time.Time            `json:"at"`
	Workload *WorkloadObservation `json:"workload,omitempty"`
	Facts    *NodeFacts           `json:"facts,omitempty"`
	Result   *Result              `json:"result,omitempty"`
}

// EventBatch is the body of an events call.
type EventBatch struct {
	Events []Event `json:"events"`
	// Through, when set, is the node's event-ID watermark: an ID of its
	// current incarnation such that every event of that incarnation at or
	// below its sequence has been acknowledged by the control plane, or
	// will never be sent (minted and abandoned). The control plane may
	// then forget which of those it applied: any of them delivered again
	// is a duplicate by its sequence alone. Agents before it never send
	// it, and their de-duplication rows are kept.
	Through string `json:"through,omitempty"`
}

// ParseEventID splits an event ID the agent minted, "<incarnation>-<seq>"
// with the sequence in decimal, into its parts; ok is false for any other
// form (an ID is otherwise opaque, and such events are deduplicated by
// the whole ID only).
func ParseEventID(id string) (incarnation string, seq uint64, ok bool) {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(id[i+1:], 10, 63)
	if err != nil {
		return "", 0, false
	}
	return id[:i], seq, true
}

// FormatEventID is the ID of sequence seq in incarnation, as the agent
// mints it (zero-padded, so IDs of one incarnation sort in minting order).
func FormatEventID(incarnation string, seq uint64) string {
	return fmt.Sprintf("%s-%016d", incarnation, seq)
}

// EventAck lists which events of a batch the control plane now holds
// (accepted now or earlier); the agent removes exactly those from its spool.
type EventAck struct {
	Accepted []string `json:"accepted"`
}
