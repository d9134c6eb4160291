// Package nodeproto is the node protocol: the contract between the control
// plane and the node agent. It holds the capability version and its dated
// history, the enrollment and renewal exchanges, the envelopes (a Command the
// control plane sends down a node's session, an Event a node reports, the
// Result of one operation; envelope.go), their payloads (the commands, and
// the facts and observations a node reports), and the functions path
// (functions.go). Both sides import it, and it imports nothing of
// Mercator's, so changing it is changing the wire protocol: a field renamed
// here is a field an agent already in the fleet no longer understands.
//
// It was two packages (capability for the payloads, node for the
// envelopes) under names that did not say they were one protocol.
//
// # Capability version
//
// Version is one integer, raised whenever either side gains something the
// other may need to know about (Tailscale's tailcfg.CapabilityVersion is the
// model). Never compare it as semver: a control plane checks "is the agent's
// version at least N" for the feature added in N. History:
//
//   - 1 (2026-11-30): enroll, renew, session stream, events, logs;
//     commands prepare_image, prepare_artifact, launch_workload,
//     stop_workload; workload observations, node facts, operation results
//     carried in the event spool.
//   - 2 (2026-11-30): Artifacts. prepare_artifact fetches through the
//     location the control plane minted for it (URL, ExpiresAt) and carries
//     the Format; launch_workload carries the Artifacts to mount read-only
//     and waits for them; NodeFacts lists the Artifact versions held
//     (Artifacts) and the artifact-copy floor (Link).
//   - 3 (2026-11-30): Functions. The invoke command (InvokeCommand), sent
//     down the session and never stored, whose bodies travel over the
//     agent's own requests to the calls paths (PathCalls); NodeFacts states
//     the share of the machine set aside for function containers
//     (Functions). See functions.go.
//   - 4 (2026-11-30): synchronous call logs on request. The call_log
//     command (CallLogCommand), sent down the session like invoke and never
//     stored, asks the node for the log it keeps of one call; the agent
//     answers over its own request to PathCallLogs. A control plane asks
//     only agents at VersionCallLogs or later: an older one would take the
//     unknown command for an operation.
//   - 5 (2026-12-01): hardening. launch_workload may carry run secrets
//     (LaunchWorkloadCommand.SecretNames, Secrets) and the containment a
//     Run asked for (User, ReadOnlyRootfs, Network "none", PidsLimit): an
//     older agent would ignore them and start the container without them,
//     so such a launch goes only to an agent at VersionHardening or later.
//     Agents at this version also hold every container to the node's
//     containment (capabilities dropped, no-new-privileges, pids, log and
//     default CPU and memory limits).
//   - 6 (2026-12-01): GPU health. NodeFacts.GPUHealth states each GPU's
//     health as the agent's sampler judged it (a GPU listed at enrollment
//     stays listed, as sick, once the vendor tool stops listing it), and a
//     workload observation carries the summary of its GPUs' utilization
//     (WorkloadObservation.GPUUsage). Nothing new is sent to the agent (a
//     stop for a bad GPU is stop_workload with reason "gpu_failed"), so an
//     older agent needs nothing; a control plane older than this refuses
//     the new fields, so control planes are upgraded first, as always.
//   - 7 (2026-12-01): warm capacity. The hold command (HoldCommand), sent
//     down the session like invoke and never stored, asks the node to pull
//     a function's image now and keep Count of its containers started until
//     the hold lapses; the control plane repeats it while the policy
//     stands. An older agent would take the unknown command for an
//     operation, so it goes only to agents at VersionWarmCapacity or later.
//   - 8 (2026-12-01): self-upgrade. The upgrade_agent command
//     (UpgradeAgentCommand, upgrade.go): fetch a release through a minted
//     read, verify it, replace the agent's own binary and re-exec. An older
//     agent would take the unknown kind for an operation and fail it, so
//     a control plane sends it only to agents at VersionUpgrade or later.
//   - 9 (2026-12-01): gang runs. launch_workload may carry GangSize, the
//     members of the gang the launch is one of, and only such a launch
//     may ask for Network "host" (NCCL between machines needs it). An
//     older agent refuses the host's network, so a gang launch asking for
//     it goes only to agents at VersionGang or later; one that does not
//     ask needs nothing new (the rank variables are plain Env).
//   - 10 (2026-12-02): function spares. A hold may say Release
//     (HoldCommand.Release): the function was deleted, so the node drops
//     what it keeps of it ahead of calls (its prepared and idle
//     containers). An older agent would take it for a prefetch and pull
//     the deleted function's image, so it goes only to agents at
//     VersionFnSpares or later.
package nodeproto

import (
	"maps"
	"regexp"
	"time"
)

// Version is the capability version this build speaks. See the package doc
// for what each version added.
const Version = 10

// The first version of each feature a command may need, from the history
// above. A control plane sends a command only to a node whose agent is at
// least at the version the command needs (RequiredVersion).
const (
	// VersionArtifacts: prepare_artifact through a minted location, and
	// launch_workload mounting Artifacts.
	VersionArtifacts = 2
	// VersionFunctions: the invoke command and the function share.
	VersionFunctions = 3
	// VersionCallLogs: the call_log command (CallLogCommand).
	VersionCallLogs = 4
	// VersionHardening: launch_workload carrying run secrets or
	// containment fields.
	VersionHardening = 5
	// VersionGPUHealth: facts carrying GPUHealth, workload observations
	// carrying GPUUsage.
	VersionGPUHealth = 6
	// VersionWarmCapacity: the hold command (HoldCommand).
	VersionWarmCapacity = 7
	// VersionUpgrade: the upgrade_agent command (UpgradeAgentCommand).
	VersionUpgrade = 8
	// VersionGang: launch_workload of a gang member (GangSize) on the
	// host's network.
	VersionGang = 9
	// VersionFnSpares: a hold that releases a deleted function
	// (HoldCommand.Release).
	VersionFnSpares = 10
)

// Paths of the node protocol, relative to the control plane's base URL. Every
// one is called by the agent; the control plane never calls a node.
const (
	PathEnroll  = "/v1/node/enroll"
	PathRenew   = "/v1/node/renew"
	PathSession = "/v1/node/session"
	PathEvents  = "/v1/node/events"
	PathLogs    = "/v1/node/logs"
)

// Bodies the control plane accepts from a node (hardening, bounded
// servers): an event batch (PathEvents) of at most MaxEventBody bytes of
// JSON, and a log chunk (PathLogs) of at most MaxLogBody. The agent splits
// a spool batch that would be larger (a batch it could never deliver would
// block the spool for ever).
const (
	MaxEventBody = 4 << 20
	MaxLogBody   = 1 << 20
)

// HeaderNodeID names the node on every authenticated node-protocol call; the
// session credential travels as "Authorization: Bearer <token>".
const HeaderNodeID = "Mercator-Node-Id"

// EnrollmentRequest spends a single-use invitation.
type EnrollmentRequest struct {
	NodeID            string `json:"node_id"`
	Invitation        string `json:"invitation"`
	AgentVersion      string `json:"agent_version"`
	CapabilityVersion int    `json:"capability_version"`
}

// Enrollment is what the control plane answers a successful enrollment with.
// FencingToken is strictly greater than any token this node held before.
type Enrollment struct {
	NodeID       string        `json:"node_id"`
	SessionToken string        `json:"session_token"`
	ExpiresAt    time.Time     `json:"expires_at"`
	FencingToken uint64        `json:"fencing_token"`
	Lease        time.Duration `json:"lease_ns"`
}

// SessionRenewal is a later credential for the same session. FencingToken is
// unchanged by a renewal.
type SessionRenewal struct {
	SessionToken string    `json:"session_token"`
	ExpiresAt    time.Time `json:"expires_at"`
	FencingToken uint64    `json:"fencing_token"`
}

// NodeFacts is what a node measured about itself. A field the node could not
// measure is zero and, where it matters, explained in Notes; nothing here is
// a guess.
type NodeFacts struct {
	Hostname          string        `json:"hostname"`
	OS                string        `json:"os"`
	Arch              string        `json:"arch"`
	CPUs              float64       `json:"cpus"`
	MemoryBytes       int64         `json:"memory_bytes"`
	DiskFreeBytes     int64         `json:"disk_free_bytes"`
	RuntimeName       string        `json:"runtime_name"`
	RuntimeVersion    string        `json:"runtime_version"`
	RuntimeAPIVersion string        `json:"runtime_api_version"`
	AgentVersion      string        `json:"agent_version"`
	CapabilityVersion int           `json:"capability_version"`
	Images            []string      `json:"images,omitempty"`
	Accelerators      []Accelerator `json:"accelerators,omitempty"`
	// Artifacts is the inventory of Artifact content this node holds,
	// complete and verified, ordered by digest.
	Artifacts []HeldArtifact `json:"artifacts,omitempty"`
	// Link is the slowest artifact copy this node timed within its
	// reading's validity, or nil when it has none: an unmeasured path,
	// never a guess.
	Link *LinkReading `json:"link,omitempty"`
	// Functions is the share of this machine set aside for function
	// containers, and what runs in it; nil when the node runs no functions.
	Functions *FunctionCapacity `json:"functions,omitempty"`
	// GPUHealth is the health sampler's judgement of each accelerator the
	// node listed at enrollment (gpuhealth.go), one entry per UUID; nil
	// from an agent that does not sample (older ones), which the control
	// plane reads as "no word", never as "sick".
	GPUHealth []GPUHealth `json:"gpu_health,omitempty"`
	Notes     []string    `json:"notes,omitempty"`
	// Labels are the node's labels as its agent was started with them
	// (`mercator agent --label KEY=VALUE`); an operator's `node label`
	// overrides them. Runs' constraints and projects' pools select on them.
	Labels map[string]string `json:"labels,omitempty"`
	// NoSelfUpgrade says the agent cannot replace its own binary: it runs
	// in the control plane's process (`mercator server --local-agent`,
	// `mercator dev`), which an upgrade would replace too. A rollout of
	// every node passes over it; one that names it is refused.
	NoSelfUpgrade bool `json:"no_self_upgrade,omitempty"`
}

// HeldArtifact is one Artifact content a node holds, by digest, with the
// NAME@VERSION references it was prepared as.
type HeldArtifact struct {
	SHA256 string   `json:"sha256"`
	Size   int64    `json:"size"`
	Refs   []string `json:"refs,omitempty"`
}

// LinkReading is a node's measurement of how fast it can take Artifact
// content in. Source names what was timed (the node agent's
// ArtifactCopySource: the whole copy, transfer, disk and hashing, as one
// duration); Confidence is how much the node stands behind it; a reading
// is not evidence past ValidUntil, and a control plane treats one it holds
// beyond that moment as absent.
type LinkReading struct {
	Source         string  `json:"source"`
	BytesPerSecond int64   `json:"bytes_per_second"`
	Confidence     float64 `json:"confidence"`
	// Bytes is the size of the copy that was timed.
	Bytes      int64     `json:"bytes"`
	MeasuredAt time.Time `json:"measured_at"`
	ValidUntil time.Time `json:"valid_until"`
}

// Accelerator is one device as the vendor tool described it.
type Accelerator struct {
	Vendor        string `json:"vendor"`
	Model         string `json:"model"`
	UUID          string `json:"uuid"`
	MemoryBytes   int64  `json:"memory_bytes"`
	DriverVersion string `json:"driver_version,omitempty"`
	CUDAVersion   string `json:"cuda_version,omitempty"`
	PCIBusID      string `json:"pci_bus_id,omitempty"`
}

// PrepareImageCommand asks the node to hold an image. Image is always pinned
// by manifest digest (repo@sha256:…); a node refuses anything else.
type PrepareImageCommand struct {
	Image string `json:"image"`
	// RegistryAuth is the base64 JSON the Engine API takes as
	// X-Registry-Auth. It lives in memory for one pull and is never written
	// to the node's state, logs or spool.
	RegistryAuth string `json:"registry_auth,omitempty"`
}

// PrepareArtifactCommand asks the node to hold one immutable artifact
// version, fetched only through URL, which the control plane minted for this
// one fetch and which expires at ExpiresAt.
//
// The control plane stores the command without URL and ExpiresAt and mints
// them each time it sends the command, so a command redelivered after a
// partition carries a fresh read, and no stored operation holds one.
type PrepareArtifactCommand struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
	Size    int64  `json:"size"`
	// Format is "file" or "tar" (see api.ArtifactFile, api.ArtifactTar).
	Format    string    `json:"format,omitempty"`
	URL       string    `json:"url,omitempty"`
	ExpiresAt time.Time `json:"expires_at,omitempty"`
}

// Ref is the version's reference, NAME@VERSION.
func (c PrepareArtifactCommand) Ref() string { return c.Name + "@" + c.Version }

// ArtifactMount is one Artifact version a launch mounts read-only at
// MountPath. It carries the whole prepare (with its own minted read), so a
// node that does not hold the content yet fetches it before starting the
// container, or waits for the prepare already under way.
type ArtifactMount struct {
	PrepareArtifactCommand
	MountPath string `json:"mount_path"`
}

// WorkloadKey names one attempt of one run; the container's name is derived
// from it, which is what lets the daemon refuse a duplicate.
type WorkloadKey struct {
	RunID   string `json:"run_id"`
	Attempt int    `json:"attempt"`
}

// LaunchWorkloadCommand starts one attempt of a run.
type LaunchWorkloadCommand struct {
	WorkloadKey
	// Image is pinned by digest. The agent prepares it first if needed.
	Image string `json:"image"`
	// RegistryAuth is as in PrepareImageCommand. The control plane stores
	// the command without it and attaches it each time it sends the
	// command, from the credential stored for the image's registry.
	RegistryAuth string            `json:"registry_auth,omitempty"`
	Command      []string          `json:"command,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
	// CPU in cores (0.5 = half a core); 0 means the node's default quota
	// (unlimited on an agent before VersionHardening).
	CPU float64 `json:"cpu,omitempty"`
	// MemoryBytes is a hard limit; 0 means the node's default limit
	// (unlimited on an agent before VersionHardening).
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// GPUs are device UUIDs assigned by the scheduler.
	GPUs []string `json:"gpus,omitempty"`
	// Timeout, when positive, is enforced by the node from the daemon's own
	// start moment, so it holds through a partition and an agent restart.
	Timeout time.Duration `json:"timeout_ns,omitempty"`
	// Artifacts are mounted read-only; the container is not created until
	// the node holds every one of them, verified.
	Artifacts []ArtifactMount `json:"artifacts,omitempty"`

	// SecretNames are the names of the run's secrets (capability version
	// VersionHardening), stored with the command; Secrets are their
	// values, which the control plane stores the command without and
	// attaches, opened from the run's sealed secrets, each time it sends
	// the command (as RegistryAuth). The agent sets them in the container's
	// environment beside Env (Environment), refuses a launch that names a
	// secret it was not given (MissingSecrets), and never writes them to
	// its state, logs or spool: a launch redelivered after an agent restart
	// carries them again.
	SecretNames []string          `json:"secret_names,omitempty"`
	Secrets     map[string]string `json:"secrets,omitempty"`
	// Containment the Run asked for (api.RunSpec's fields of the same
	// names); the node's own containment applies whatever these say.
	// Setting any of them makes the launch need VersionHardening.
	//
	// User runs the command as "uid[:gid]" or a name the image defines;
	// empty is the image's user.
	User string `json:"user,omitempty"`
	// ReadOnlyRootfs mounts the container's root filesystem read-only.
	ReadOnlyRootfs bool `json:"read_only_rootfs,omitempty"`
	// Network is "" (the daemon's default bridge) or "none" (loopback
	// only), or "host" for a gang member (GangSize above 1); a node
	// refuses anything else (NetworkAllowed).
	Network string `json:"network,omitempty"`
	// GangSize, above 1, says the launch is one member of a gang of that
	// many (its rank is in Env, MERCATOR_RANK); 0 for a run that is not a
	// gang. It is what lets the launch have the host's network.
	GangSize int `json:"gang_size,omitempty"`
	// PidsLimit, when positive, replaces the node's process limit, up to
	// the node's maximum; a launch above it fails.
	PidsLimit int64 `json:"pids_limit,omitempty"`

	// ReportProgress asks the node to report how its preparation goes
	// (WorkloadObservation.Progress). It needs no capability version:
	// an agent that does not know it ignores it (agents decode commands
	// leniently), and an agent reports progress only when asked, so a
	// control plane that does not know the field is never sent it.
	ReportProgress bool `json:"report_progress,omitempty"`
}

// Steps of a launch's preparation that a node reports progress on.
const (
	ProgressImage     = "image"     // pulling the image
	ProgressArtifacts = "artifacts" // copying the Artifacts
)

// PrepareProgress is how far a launch's preparation has come: the step
// and, where the node can tell, the bytes done of the bytes in all (Total 0:
// not known yet). A node reports it with a preparing observation at most
// every few seconds, and only while the launch prepares.
type PrepareProgress struct {
	Step       string `json:"step"`
	DoneBytes  int64  `json:"done_bytes,omitempty"`
	TotalBytes int64  `json:"total_bytes,omitempty"`
}

// Environment is the container's environment: Env and Secrets together
// (the control plane never lets a name be in both; were one in both, the
// secret would win). It returns Env itself when there are no secrets.
func (l LaunchWorkloadCommand) Environment() map[string]string {
	if len(l.Secrets) == 0 {
		return l.Env
	}
	env := make(map[string]string, len(l.Env)+len(l.Secrets))
	maps.Copy(env, l.Env)
	maps.Copy(env, l.Secrets)
	return env
}

// MissingSecrets lists the names in SecretNames that Secrets has no value
// for: a launch sent without the values it names (the control plane could
// not open them), which must not start.
func (l LaunchWorkloadCommand) MissingSecrets() []string {
	var missing []string
	for _, name := range l.SecretNames {
		if _, ok := l.Secrets[name]; !ok {
			missing = append(missing, name)
		}
	}
	return missing
}

// NetworkNone is the one network a launch may name instead of the node's
// default bridge: loopback only.
const NetworkNone = "none"

// NetworkHost is the host's network, which a node gives only a gang
// member's launch (VersionGang).
const NetworkHost = "host"

// NetworkAllowed reports whether a node may give the launch the network it
// names: the default bridge, "none", or the host's for a gang member.
func (l LaunchWorkloadCommand) NetworkAllowed() bool {
	return l.Network == "" || l.Network == NetworkNone || (l.Network == NetworkHost && l.GangSize > 1)
}

// userPattern is a user, and optionally a group, by name or number, as
// Docker's --user takes them; nothing that could be read as an option or a
// path.
var userPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?$`)

// ValidUser reports whether user is what a launch's User may be: a name or
// number, optionally with ":group" by name or number, at most 64
// characters each. The control plane checks it before it stores a run and
// every node again before it creates a container.
func ValidUser(user string) bool { return userPattern.MatchString(user) }

// AsksContainment reports whether the launch carries any containment
// field, and so needs an agent at VersionHardening.
func (c LaunchWorkloadCommand) AsksContainment() bool {
	return c.User != "" || c.ReadOnlyRootfs || c.Network != "" || c.PidsLimit != 0
}

// StopWorkloadCommand stops one attempt: the signal, then after GracePeriod
// a kill. Stopping a workload that is gone succeeds.
type StopWorkloadCommand struct {
	WorkloadKey
	// Reason is reported back in later observations ("cancelled",
	// "timeout", "replaced", "drained").
	Reason      string        `json:"reason,omitempty"`
	GracePeriod time.Duration `json:"grace_period_ns,omitempty"`
}

// Workload phases a node reports.
const (
	PhasePreparing = "preparing" // the image is being pulled
	PhaseCreated   = "created"   // the container exists but has not started
	PhaseRunning   = "running"
	PhaseExited    = "exited"
	PhaseFailed    = "failed"  // the node could not start it; Error says why
	PhaseMissing   = "missing" // the daemon no longer knows the container
)

// WorkloadObservation is what the node saw of one attempt. StartedAt and
// FinishedAt are the daemon's own moments, never the agent's clock.
type WorkloadObservation struct {
	WorkloadKey
	ContainerID string     `json:"container_id,omitempty"`
	Image       string     `json:"image,omitempty"`
	Phase       string     `json:"phase"`
	ExitCode    *int       `json:"exit_code,omitempty"`
	OOMKilled   bool       `json:"oom_killed,omitempty"`
	StartedAt   *time.Time `json:"started_at,omitempty"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	StopReason  string     `json:"stop_reason,omitempty"`
	Error       string     `json:"error,omitempty"`
	// Progress is a preparing launch's progress, when the launch asked for
	// it (LaunchWorkloadCommand.ReportProgress); nil otherwise.
	Progress *PrepareProgress `json:"progress,omitempty"`
	// Timeout is the launch's timeout as the container's labels state it, so
	// a restarted agent still enforces it; zero means none.
	Timeout time.Duration `json:"timeout_ns,omitempty"`
	// GPUs are the devices the workload was given, as the runtime read
	// them back; the agent's own bookkeeping, never sent.
	GPUs []string `json:"-"`
	// GPUUsage is the summary of the workload's GPUs since it started
	// (gpuhealth.go), from agents at VersionGPUHealth; nil without GPUs.
	GPUUsage []GPUUsage `json:"gpu_usage,omitempty"`
}

// Same reports whether two observations say the same thing, which is what
// decides whether the control plane needs to hear it again.
func (o WorkloadObservation) Same(p WorkloadObservation) bool {
	eqTime := func(a, b *time.Time) bool {
		if a == nil || b == nil {
			return a == b
		}
		return a.Equal(*b)
	}
	eqInt := func(a, b *int) bool {
		if a == nil || b == nil {
			return a == b
		}
		return *a == *b
	}
	return o.WorkloadKey == p.WorkloadKey && o.ContainerID == p.ContainerID &&
		o.Phase == p.Phase && eqInt(o.ExitCode, p.ExitCode) && o.OOMKilled == p.OOMKilled &&
		eqTime(o.StartedAt, p.StartedAt) && eqTime(o.FinishedAt, p.FinishedAt) &&
		o.StopReason == p.StopReason && o.Error == p.Error &&
		(o.Progress == p.Progress || (o.Progress != nil && p.Progress != nil && *o.Progress == *p.Progress)) &&
		sameUsage(o.GPUUsage, p.GPUUsage)
}

// LogChunk is a piece of one attempt's combined stdout and stderr. Offset is
// the byte position of Data in that attempt's whole log, so a redelivered
// chunk is recognised and appended once.
type LogChunk struct {
	WorkloadKey
	Offset int64  `json:"offset"`
	Data   []byte `json:"data"`
}

// LogAck tells the agent how many bytes of the attempt's log the control
// plane holds, so it can skip what was already delivered.
type LogAck struct {
	Size int64 `json:"size"`
	// Truncated is set once the attempt's log reached its cap: the control
	// plane drops whatever else is sent, so the agent may stop shipping.
	Truncated bool `json:"truncated,omitempty"`
}
