// Package api holds the public HTTP API's wire types, its routes, the one
// translation between failure kinds and HTTP status codes in each direction,
// and the validation of a run spec (RunSpec.Validate, validate.go), so that
// the CLI refuses what the control plane would refuse, with the same words.
// The control plane's handlers, the Go client and the CLI import it. Field
// names are stable: they are what `-o json` prints and what scripts read.
// They are not what the control plane stores: its records have their own
// stored names (package store), so a field here can change without a data
// migration.
package api

import (
	"fmt"
	"time"

	"github.com/mercator/mercator/internal/bytesize"
)

// Prefix is the version prefix of every public route.
const Prefix = "/v1"

// Run statuses, in the order a run normally moves through them.
const (
	RunQueued    = "queued"    // accepted, not yet placed
	RunPlaced    = "placed"    // an attempt was assigned to a node
	RunPreparing = "preparing" // the node is preparing the image
	RunRunning   = "running"   // the daemon reports the container running
	RunSucceeded = "succeeded" // exited 0
	RunFailed    = "failed"    // exited non-zero, could not start, or timed out
	RunCancelled = "cancelled" // cancelled by a user
)

// Attempt statuses. "unknown" means the node stopped reporting; its real
// report settles the attempt later.
const (
	AttemptPlaced    = "placed"
	AttemptPreparing = "preparing"
	AttemptRunning   = "running"
	AttemptSucceeded = "succeeded"
	AttemptFailed    = "failed"
	AttemptCancelled = "cancelled"
	AttemptUnknown   = "unknown"
	// AttemptPreempted: stopped to make room for other work
	// (Attempt.PreemptedBy says for what); its run is queued again.
	AttemptPreempted = "preempted"
)

// Terminal reports whether a run status is final.
func Terminal(status string) bool {
	return status == RunSucceeded || status == RunFailed || status == RunCancelled
}

// RunSpec is the body of POST /v1/runs.
type RunSpec struct {
	// Image is a reference with a tag or a digest; the control plane pins it
	// to a manifest digest at submit.
	Image   string            `json:"image"`
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// CPU in cores; 0 means the node's default quota (one core unless its
	// operator says otherwise), which the scheduler does not count.
	CPU float64 `json:"cpu,omitempty"`
	// MemoryBytes is a hard limit; 0 means the node's default limit (2 GiB
	// unless its operator says otherwise), which the scheduler does not
	// count.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// TimeoutSeconds, when positive, ends the run as failed that long after
	// its container started.
	TimeoutSeconds int64 `json:"timeout_seconds,omitempty"`
	// Retries is how many further attempts a failed attempt may get
	// (non-zero exit, failure to start). 0 means one attempt only.
	Retries int `json:"retries,omitempty"`
	// GPUs is the number of whole GPUs the run needs; the scheduler assigns
	// specific devices by UUID.
	GPUs int `json:"gpus,omitempty"`
	// GPUModel, when set, restricts GPUs to models containing it
	// (case-insensitive), e.g. "H100".
	GPUModel string `json:"gpu_model,omitempty"`
	// GPUMemoryBytes, when positive, is the minimum memory per GPU.
	GPUMemoryBytes int64 `json:"gpu_memory_bytes,omitempty"`
	// ReplaceAfterSeconds is how long an attempt's node may be unreachable
	// before the attempt is replaced by a new one elsewhere: 0 means the
	// default (300), negative means never. A replaced attempt that turns out
	// to be alive is stopped when its node returns, so at most one attempt
	// keeps running.
	ReplaceAfterSeconds int64 `json:"replace_after_seconds,omitempty"`
	// Artifacts are immutable Artifact versions mounted read-only into the
	// container; the container starts only once its node holds them all.
	Artifacts []ArtifactMount `json:"artifacts,omitempty"`

	// Retention (issue 16, item 4). LogLimitBytes caps each attempt's
	// log as the control plane keeps it: past it, output is dropped and
	// the log ends with one line saying where it was truncated. 0 means
	// the control plane's default (100 MiB unless configured); more than
	// its maximum (--max-log-limit) is refused at submit.
	LogLimitBytes int64 `json:"log_limit_bytes,omitempty"`
	// Secrets (hardening: run secrets) are set in the container's
	// environment like Env, but are write-only: the control plane seals
	// them as it accepts the run, sends them only inside the launch command
	// to the node that runs an attempt, and every read shows each name
	// with SecretRedacted for its value. A name may not also be in Env.
	// Submitting SecretRedacted as a value is refused (it is what a read
	// shows, not a secret), so a spec read back and resubmitted fails
	// rather than run without its secrets.
	Secrets map[string]string `json:"secrets,omitempty"`
	// Containment a run may ask for, beyond what every node applies anyway
	// (docs/hardening.md, "Contained workloads"). There is deliberately no
	// field for privileged mode, capabilities, host mounts, the host's
	// network or devices: a spec cannot reach them.
	//
	// User runs the command as "uid[:gid]" or a user name the image
	// defines; empty is the image's own user.
	User string `json:"user,omitempty"`
	// ReadOnlyRootfs mounts the container's root filesystem read-only
	// (Artifacts are read-only whatever this says).
	ReadOnlyRootfs bool `json:"read_only_rootfs,omitempty"`
	// Network is "" for the node's default bridge or "none" for loopback
	// only.
	Network string `json:"network,omitempty"`
	// PidsLimit, when positive, replaces the node's process limit; a node
	// refuses one above its own maximum. 0 is the node's limit.
	PidsLimit int64 `json:"pids_limit,omitempty"`

	// Teams (issue 17, docs/teams.md). Project is the project the run
	// belongs to and counts against; "" is DefaultProject, and the
	// control plane stores the name. Priority orders the project's queue
	// (higher first, then submission order) and decides what the run may
	// preempt in its own project: from -MaxRunPriority to MaxRunPriority,
	// 0 by default.
	Project  string `json:"project,omitempty"`
	Priority int    `json:"priority,omitempty"`
	// GraceSeconds is how long the container has between SIGTERM and
	// SIGKILL when it is stopped (preempted, cancelled, drained): 0 means
	// the default (10 s); more than the control plane's maximum is
	// refused at submit.
	GraceSeconds int64 `json:"grace_seconds,omitempty"`
	// Constraints are node labels the run requires: it goes only to
	// nodes whose label KEY is VALUE (and, in a project restricted to
	// pools, whose pool label is one of them).
	Constraints map[string]string `json:"constraints,omitempty"`

	// Gang runs (issue 18, docs/gpus.md "Gang runs"). Nodes, above 1,
	// makes the run a gang: that many members of this shape (GPUs each),
	// one per node, placed all at once or not at all and retried whole;
	// 0 or 1 is one container. MasterPort is the port rank 0 listens on
	// for the others (MASTER_PORT); 0 means DefaultMasterPort.
	Nodes      int `json:"nodes,omitempty"`
	MasterPort int `json:"master_port,omitempty"`
}

// NetworkNone is the one network a run may ask for instead of the node's
// default bridge.
const NetworkNone = "none"

// NetworkHost is the host's network, which only a gang's members may ask
// for: NCCL between machines needs the hosts' interfaces, not a bridge.
const NetworkHost = "host"

// Gang limits: MaxRunNodes members at most; DefaultMasterPort is
// PyTorch's customary rendezvous port.
const (
	MaxRunNodes       = 64
	DefaultMasterPort = 29500
)

// Run is a run as the API shows it.
type Run struct {
	ID string `json:"id"`
	RunSpec
	// PinnedImage is Image resolved to repo@sha256:…, the only reference a
	// node ever pulls.
	PinnedImage string     `json:"pinned_image"`
	Status      string     `json:"status"`
	Reason      string     `json:"reason,omitempty"`
	ExitCode    *int       `json:"exit_code,omitempty"`
	Attempts    []Attempt  `json:"attempts"`
	Cancel      bool       `json:"cancel_requested,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	// Queue is where a queued run stands in its project's queue, as the
	// scheduler's last pass left it; absent for a run not queued, or
	// before a pass (docs/teams.md).
	Queue *QueuePosition `json:"queue,omitempty"`
}

// QueuePosition is a queued run's place in its project's queue: the order
// the scheduler considers the project's runs in (priority, then
// submission).
type QueuePosition struct {
	Project string `json:"project"`
	// Position is 1 for the next run of the project, Of how many wait.
	Position int `json:"position"`
	Of       int `json:"of"`
	// Ahead are the runs just ahead of it (up to three, nearest last).
	Ahead []string `json:"ahead,omitempty"`
	// EarliestStart, when set, is a bound from running work with
	// timeouts: by then at least Position of the fleet's running runs
	// must have ended. It is not a promise; other work may come first.
	EarliestStart *time.Time `json:"earliest_start,omitempty"`
}

// Attempt is one placement of a run.
type Attempt struct {
	Number      int      `json:"number"`
	NodeID      string   `json:"node_id"`
	GPUs        []string `json:"gpus,omitempty"`
	Status      string   `json:"status"`
	ContainerID string   `json:"container_id,omitempty"`
	ExitCode    *int     `json:"exit_code,omitempty"`
	OOMKilled   bool     `json:"oom_killed,omitempty"`
	Error       string   `json:"error,omitempty"`
	StopReason  string   `json:"stop_reason,omitempty"`
	// Replaced is set when the control plane gave up on this attempt because
	// its node was unreachable past the run's replace-after; a later attempt
	// took its place. If the node comes back with it still running, it is
	// stopped.
	Replaced bool `json:"replaced,omitempty"`
	// StopRequested is set once a stop operation was issued for the attempt.
	StopRequested bool       `json:"stop_requested,omitempty"`
	PlacedAt      time.Time  `json:"placed_at"`
	StartedAt     *time.Time `json:"started_at,omitempty"`
	FinishedAt    *time.Time `json:"finished_at,omitempty"`
	// Preemption (docs/teams.md): PreemptedBy says who stopped the
	// attempt and why ("preempted by r-… (priority 100) to reclaim project
	// nlp's quota"), PreemptedFor is that reason as a word
	// ("reclaim:nlp"), PreemptedAt when it was decided. The attempt ends
	// preempted and the run is queued again without spending a retry.
	PreemptedBy  string     `json:"preempted_by,omitempty"`
	PreemptedFor string     `json:"preempted_for,omitempty"`
	PreemptedAt  *time.Time `json:"preempted_at,omitempty"`
	// Progress is how the node's preparation of a preparing attempt goes
	// (pulling the image, copying the Artifacts), as the node last
	// reported it (every few seconds); nil before a report and once the
	// attempt is past preparing.
	Progress *PrepareProgress `json:"progress,omitempty"`
	// Failure is the typed cause of a failed attempt where one is known
	// (gpus.go); nil otherwise.
	Failure *AttemptFailure `json:"failure,omitempty"`
	// GPUUsage summarises the use of the attempt's GPUs (gpus.go), as last
	// reported by its node; empty without GPUs or GPU samples.
	GPUUsage []GPUUsage `json:"gpu_usage,omitempty"`
	// Xids are the application Xids logged for its GPUs while it ran.
	Xids []GPUXid `json:"xids,omitempty"`
	// Set and Rank place a gang's attempt (RunSpec.Nodes above 1): Set
	// numbers the attempt sets, one per try of the whole gang, from 1;
	// Rank is the member's rank within its set, from 0. Both are 0 for a
	// run that is not a gang.
	Set  int `json:"set,omitempty"`
	Rank int `json:"rank,omitempty"`
}

// PrepareProgress is a preparing attempt's progress: Step is "image"
// (pulling it) or "artifacts" (copying them); DoneBytes of TotalBytes where
// the node can tell (TotalBytes 0: not known).
type PrepareProgress struct {
	Step       string `json:"step"`
	DoneBytes  int64  `json:"done_bytes,omitempty"`
	TotalBytes int64  `json:"total_bytes,omitempty"`
}

// String is the progress in words, as the CLI and the console show it:
// "pulling the image: 45% (117.0 MiB of 260.0 MiB)", "copying the
// Artifacts (1.2 GiB)".
func (p PrepareProgress) String() string {
	switch {
	case p.Step == "artifacts" && p.TotalBytes > 0:
		return "copying the Artifacts (" + bytesize.Format(p.TotalBytes) + ")"
	case p.Step == "artifacts":
		return "copying the Artifacts"
	case p.TotalBytes > 0:
		return fmt.Sprintf("pulling the image: %d%% (%s of %s)", p.DoneBytes*100/p.TotalBytes, bytesize.Format(p.DoneBytes), bytesize.Format(p.TotalBytes))
	case p.DoneBytes > 0:
		return "pulling the image: " + bytesize.Format(p.DoneBytes)
	}
	return "pulling the image"
}

// Stage is where a run stands, in words, as `run wait` shows it on a
// terminal: "queued: REASON", "placed on node N", "preparing on node N:
// pulling the image: 45% (…)" (the progress its node last reported),
// "running on node N"; "" once the run has ended.
func (r Run) Stage() string {
	var cur Attempt
	if n := len(r.Attempts); n > 0 {
		cur = r.Attempts[n-1]
	}
	where := "node " + cur.NodeID
	if r.Nodes > 1 { // a gang: its set's members are on that many nodes
		where = fmt.Sprintf("%d nodes (attempt set %d)", r.Nodes, cur.Set)
		if r.Reason != "" && !Terminal(r.Status) {
			where += ": " + r.Reason // stopping the other members of a broken set
		}
	}
	switch r.Status {
	case RunQueued:
		if r.Reason != "" {
			return "queued: " + r.Reason
		}
		return "queued"
	case RunPlaced:
		return "placed on " + where
	case RunPreparing:
		what := "pulling the image"
		if len(r.Artifacts) > 0 {
			what += fmt.Sprintf(", copying %d Artifact(s)", len(r.Artifacts))
		}
		if cur.Progress != nil {
			what = cur.Progress.String()
		}
		return "preparing on " + where + ": " + what
	case RunRunning:
		return "running on " + where
	}
	return ""
}

// RunList is the body of GET /v1/runs, and of the answer to POST
// /v1/runs/batch (the runs created, in the order of the request's specs).
type RunList struct {
	Runs []Run `json:"runs"`
}

// MaxRunBatch is the most runs one POST /v1/runs/batch may create. A
// larger batch is refused whole; a client splits it into calls of at most
// this many.
const MaxRunBatch = 1000

// Idempotent submission. A POST /v1/runs or /v1/runs/batch carrying
// HeaderIdempotencyKey creates its runs once: the same caller sending the
// same key with the same body again (a retry after a lost answer, perhaps
// to another replica) gets the runs the first call created, answered as
// the first call was and marked with HeaderIdempotentReplayed, and the same
// key with another body is refused (409 conflict). A key is 1 to
// MaxIdempotencyKey characters of letters, digits and - _ . : and holds as
// long as its runs are kept.
const (
	HeaderIdempotencyKey     = "Idempotency-Key"
	HeaderIdempotentReplayed = "Idempotent-Replayed"
	MaxIdempotencyKey        = 128
)

// RunBatch is the body of POST /v1/runs/batch: runs to create together,
// all or none (see the route's documentation). At most MaxRunBatch.
type RunBatch struct {
	Runs []RunSpec `json:"runs"`
}

// Node statuses.
const (
	NodeInvited     = "invited"     // an invitation exists, never enrolled
	NodeReady       = "ready"       // enrolled and inside its lease
	NodeUnreachable = "unreachable" // past its lease
)

// Node is a machine as the API shows it.
type Node struct {
	ID           string        `json:"id"`
	Status       string        `json:"status"`
	FencingToken uint64        `json:"fencing_token"`
	EnrolledAt   *time.Time    `json:"enrolled_at,omitempty"`
	LastSeenAt   *time.Time    `json:"last_seen_at,omitempty"`
	Facts        *NodeFactsDoc `json:"facts,omitempty"`
	// Running lists the attempts the control plane believes are on the node.
	Running []string `json:"running,omitempty"`
	// GPUsInUse are the UUIDs of the GPUs its active attempts hold (the
	// rest of its accelerators are free, unless a flag names them).
	GPUsInUse []string `json:"gpus_in_use,omitempty"`
	// Cordoned: the node takes no new work. Draining: cordoned, and its
	// remaining work is stopped at DrainDeadline when one is set.
	Cordoned      bool       `json:"cordoned"`
	Draining      bool       `json:"draining"`
	DrainDeadline *time.Time `json:"drain_deadline,omitempty"`
	// RemovedAt is when `mercator node rm` removed the node: its
	// credentials are void and its work is treated as on an unreachable
	// node (its status is unreachable).
	RemovedAt *time.Time `json:"removed_at,omitempty"`
	// Flags are what the control plane found wrong with the node's
	// reported facts (docs/hardening.md, "Node facts"): a refused report,
	// a GPU UUID another node also claims, figures that contradict each
	// other. Empty when nothing was found.
	Flags []NodeFlag `json:"flags,omitempty"`
	// GPUs is each GPU the node lists with its health (gpus.go).
	GPUs []NodeGPU `json:"gpus,omitempty"`
	// Labels are the node's labels: its agent's (`mercator agent
	// --label`), with its operator's (`mercator node label`) over them.
	// Runs' constraints and projects' pools select on them.
	Labels map[string]string `json:"labels,omitempty"`
}

// NodeLabelsRequest is the body of POST /v1/nodes/{id}/labels: labels to
// set (replacing a key's value) and keys to remove.
type NodeLabelsRequest struct {
	Set    map[string]string `json:"set,omitempty"`
	Remove []string          `json:"remove,omitempty"`
}

// Kinds of NodeFlag. A node flagged NodeFlagFactsRefused takes no new work
// until it reports facts within bounds; a GPU flagged NodeFlagGPUDisputed
// is never placed until an operator clears it (POST
// /v1/nodes/{id}/gpus/{uuid}/clear); every other kind is a warning only.
const (
	NodeFlagFactsRefused    = "facts_refused"
	NodeFlagGPUDisputed     = "gpu_disputed"
	NodeFlagGPUDuplicate    = "gpu_duplicate"
	NodeFlagGPUUUIDFormat   = "gpu_uuid_format"
	NodeFlagGPUMemory       = "gpu_memory"
	NodeFlagShareAboveTotal = "share_above_capacity"
	NodeFlagFactsJump       = "facts_jump"
)

// NodeFlag is one thing the control plane found wrong with a node's facts:
// its Kind (NodeFlagFactsRefused, …), the GPU it concerns when it concerns
// one, what was found, and when.
type NodeFlag struct {
	Kind   string    `json:"kind"`
	GPU    string    `json:"gpu,omitempty"`
	Detail string    `json:"detail"`
	Since  time.Time `json:"since"`
}

// WithholdsGPU reports whether the flag keeps its GPU from being placed on
// (every GPU flag but the note of an uncordon, NodeFlagGPUUncordoned).
func (f NodeFlag) WithholdsGPU() bool { return f.GPU != "" && f.Kind != NodeFlagGPUUncordoned }

// DrainRequest is the body of POST /v1/nodes/{id}/drain.
type DrainRequest struct {
	// DeadlineSeconds, when positive, is how long running work may go on
	// before it is stopped; 0 means it may finish however long it takes.
	DeadlineSeconds int64 `json:"deadline_seconds,omitempty"`
}

// NodeFactsDoc is the node's last reported facts, exactly as it reported
// them (see nodeproto.NodeFacts for field meanings).
type NodeFactsDoc = map[string]any

// NodeList is the body of GET /v1/nodes.
type NodeList struct {
	Nodes []Node `json:"nodes"`
	// A page (?limit=N): Next is the after= of the next page, "" on the
	// last; Summary counts the whole fleet, whatever the page and filter.
	Next    string        `json:"next,omitempty"`
	Summary *FleetSummary `json:"summary,omitempty"`
}

// FleetSummary counts a fleet: its nodes by status (and "cordoned"), its
// GPUs "busy" (an active attempt holds it), "flagged" (a node flag names it)
// and "idle", and Matching, the nodes a page's status filter keeps.
type FleetSummary struct {
	Nodes    map[string]int `json:"nodes"`
	GPUs     map[string]int `json:"gpus"`
	Matching int            `json:"matching"`
}

// MaxNodePage is the most nodes one page of GET /v1/nodes holds.
const MaxNodePage = 1000

// InvitationRequest is the body of POST /v1/nodes/{id}/invitations.
type InvitationRequest struct {
	// TTLSeconds is how long the invitation may be spent; 0 means the
	// default (24 hours).
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
}

// Invitation is a single-use credential to enroll one node, and the exact
// command line to run on that machine.
type Invitation struct {
	NodeID    string    `json:"node_id"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
	Command   string    `json:"command"`
}

// Error is the one JSON shape of every error the API returns.
type Error struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody: Code is machine-readable (see failure.Code), Message is for a
// person, Field names the request field at fault when there is one.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}
