package record

import (
	"encoding/json"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/internal/decoder"
	"github.com/mercator/mercator/store"
)

// Stored documents. A Store keeps most records as one JSON document each.
// The records that embed an api type (runs, Artifact versions, apps, fns,
// triggers, calls) are stored through the document types below, which spell
// out every stored field with its name, instead of through the api types'
// own JSON: renaming or retagging a field of the public API then changes
// nothing on disk, and a new api field must be given a stored name here
// before it is kept (the converters stop compiling, or drop it, until it
// is). This is format version 3 of the sqlstore schema; the golden
// documents in store/storetest/testdata/v3 are its examples, and every later
// version must still read them.
//
// Nodes, sessions, invitations, operations, tokens and registry
// credentials are stored as their store records: their fields are the
// store's own, and the node protocol types inside nodes and operations are
// versioned by the capability version.

// Encode returns the stored document of a store record.
func Encode(v any) ([]byte, error) {
	switch r := v.(type) {
	case store.Run:
		v = runDocOf(r)
	case store.Artifact:
		v = artifactDoc{artifactVersionDoc: artifactVersionDoc(r.ArtifactVersion), Seq: r.Seq}
	case store.App:
		v = appDocOf(r)
	case store.Fn:
		v = fnDocOf(r)
	case store.Trigger:
		v = triggerDocOf(r.Trigger)
	case store.Call:
		v = callDocOf(r)
	case store.Project:
		v = projectDocOf(r)
	}
	return json.Marshal(v)
}

// Decode reads a stored document into a store record of type T. Fields the
// document lacks are left zero, as a record stored before they existed
// needs; fields it has and T does not are ignored.
func Decode[T any](doc []byte) (T, error) {
	var v T
	var err error
	switch p := any(&v).(type) {
	case *store.Run:
		err = decodeAs(doc, p, runDoc.record)
	case *store.Artifact:
		err = decodeAs(doc, p, func(d artifactDoc) store.Artifact {
			return store.Artifact{ArtifactVersion: api.ArtifactVersion(d.artifactVersionDoc), Seq: d.Seq}
		})
	case *store.Project:
		err = decodeAs(doc, p, projectDoc.record)
	case *store.App:
		err = decodeAs(doc, p, appDoc.record)
	case *store.Fn:
		err = decodeAs(doc, p, fnDoc.record)
	case *store.Trigger:
		err = decodeAs(doc, p, func(d triggerDoc) store.Trigger { return store.Trigger{Trigger: d.record()} })
	case *store.Call:
		err = decodeAs(doc, p, callDoc.record)
	default:
		err = decoder.Unmarshal(doc, &v)
	}
	return v, err
}

// decodeAs decodes doc as a D and converts it into *p.
func decodeAs[D, T any](doc []byte, p *T, convert func(D) T) error {
	var d D
	if err := decoder.Unmarshal(doc, &d); err != nil {
		return err
	}
	*p = convert(d)
	return nil
}

// runDoc is a store.Run as stored.
type runDoc struct {
	ID                  string             `json:"id"`
	Image               string             `json:"image"`
	Command             []string           `json:"command,omitempty"`
	Env                 map[string]string  `json:"env,omitempty"`
	CPU                 float64            `json:"cpu,omitempty"`
	MemoryBytes         int64              `json:"memory_bytes,omitempty"`
	TimeoutSeconds      int64              `json:"timeout_seconds,omitempty"`
	Retries             int                `json:"retries,omitempty"`
	GPUs                int                `json:"gpus,omitempty"`
	GPUModel            string             `json:"gpu_model,omitempty"`
	GPUMemoryBytes      int64              `json:"gpu_memory_bytes,omitempty"`
	ReplaceAfterSeconds int64              `json:"replace_after_seconds,omitempty"`
	Artifacts           []artifactMountDoc `json:"artifacts,omitempty"`
	PinnedImage         string             `json:"pinned_image"`
	Status              string             `json:"status"`
	Reason              string             `json:"reason,omitempty"`
	ExitCode            *int               `json:"exit_code,omitempty"`
	Attempts            []attemptDoc       `json:"attempts"`
	Cancel              bool               `json:"cancel_requested,omitempty"`
	CreatedAt           time.Time          `json:"created_at"`
	UpdatedAt           time.Time          `json:"updated_at"`
	FinishedAt          *time.Time         `json:"finished_at,omitempty"`
	NextCheck           *time.Time         `json:"next_check,omitempty"`
	// SealedSecrets: the run's secrets only sealed (store.Run); their
	// redacted form (api.RunSpec.Secrets) is not stored but read back
	// from these names.
	SealedSecrets map[string][]byte `json:"sealed_secrets,omitempty"`
	// Submission: the keyed submission's fingerprint (store.Run).
	Submission string `json:"submission,omitempty"`

	// Containment the run asked for (api.RunSpec).
	User           string `json:"user,omitempty"`
	ReadOnlyRootfs bool   `json:"read_only_rootfs,omitempty"`
	Network        string `json:"network,omitempty"`
	PidsLimit      int64  `json:"pids_limit,omitempty"`

	// The log cap the run asked for (api.RunSpec.LogLimitBytes).
	LogLimitBytes int64 `json:"log_limit_bytes,omitempty"`

	// Teams (api.RunSpec): the project and the priority.
	Project      string `json:"project,omitempty"`
	Priority     int    `json:"priority,omitempty"`
	GraceSeconds int64  `json:"grace_seconds,omitempty"`
	// Constraints: the node labels the run requires.
	Constraints map[string]string `json:"constraints,omitempty"`
	// Gang (api.RunSpec, issue 18): the members and the rendezvous port.
	Nodes      int `json:"nodes,omitempty"`
	MasterPort int `json:"master_port,omitempty"`
}

// attemptDoc is an api.Attempt as stored: the same fields, so that a
// conversion between them compiles only while they stay the same.
type attemptDoc struct {
	Number        int        `json:"number"`
	NodeID        string     `json:"node_id"`
	GPUs          []string   `json:"gpus,omitempty"`
	Status        string     `json:"status"`
	ContainerID   string     `json:"container_id,omitempty"`
	ExitCode      *int       `json:"exit_code,omitempty"`
	OOMKilled     bool       `json:"oom_killed,omitempty"`
	Error         string     `json:"error,omitempty"`
	StopReason    string     `json:"stop_reason,omitempty"`
	Replaced      bool       `json:"replaced,omitempty"`
	StopRequested bool       `json:"stop_requested,omitempty"`
	PlacedAt      time.Time  `json:"placed_at"`
	StartedAt     *time.Time `json:"started_at,omitempty"`
	FinishedAt    *time.Time `json:"finished_at,omitempty"`
	PreemptedBy   string     `json:"preempted_by,omitempty"`
	PreemptedFor  string     `json:"preempted_for,omitempty"`
	PreemptedAt   *time.Time `json:"preempted_at,omitempty"`
	// Progress is stored as the API's three plain fields: it lasts only
	// while an attempt prepares, and an older record simply has none.
	Progress *api.PrepareProgress `json:"progress,omitempty"`
	// Failure is stored in the api type's own JSON (kind, gpu, reason),
	// which the conversion ties to this document: renaming one of its
	// fields is a change of the stored format.
	Failure *api.AttemptFailure `json:"failure,omitempty"`
	// GPUUsage and Xids are stored in the api types' own JSON, as Failure
	// is.
	GPUUsage []api.GPUUsage `json:"gpu_usage,omitempty"`
	Xids     []api.GPUXid   `json:"xids,omitempty"`
	// A gang member's attempt set and rank (issue 18).
	Set  int `json:"set,omitempty"`
	Rank int `json:"rank,omitempty"`
}

// artifactMountDoc is an api.ArtifactMount as stored.
type artifactMountDoc struct {
	Name                  string `json:"name"`
	Version               string `json:"version,omitempty"`
	MountPath             string `json:"mount_path"`
	MinReadBytesPerSecond int64  `json:"min_read_bytes_per_second,omitempty"`
	SHA256                string `json:"sha256,omitempty"`
}

func runDocOf(r store.Run) runDoc {
	d := runDoc{
		ID: r.ID, Image: r.Image, Command: r.Command, Env: r.Env, CPU: r.CPU,
		MemoryBytes: r.MemoryBytes, TimeoutSeconds: r.TimeoutSeconds, Retries: r.Retries,
		GPUs: r.GPUs, GPUModel: r.GPUModel, GPUMemoryBytes: r.GPUMemoryBytes,
		ReplaceAfterSeconds: r.ReplaceAfterSeconds,
		PinnedImage:         r.PinnedImage, Status: r.Status, Reason: r.Reason, ExitCode: r.ExitCode,
		Cancel: r.Cancel, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, FinishedAt: r.FinishedAt,
		NextCheck: r.NextCheck, SealedSecrets: r.SealedSecrets, Submission: r.Submission,
		User: r.User, ReadOnlyRootfs: r.ReadOnlyRootfs, Network: r.Network, PidsLimit: r.PidsLimit,
		LogLimitBytes: r.LogLimitBytes, Project: r.Project, Priority: r.Priority, GraceSeconds: r.GraceSeconds, Constraints: r.Constraints,
		Nodes: r.Nodes, MasterPort: r.MasterPort,
	}
	d.Artifacts = convertAll(r.Artifacts, func(m api.ArtifactMount) artifactMountDoc { return artifactMountDoc(m) })
	d.Attempts = convertAll(r.Attempts, func(a api.Attempt) attemptDoc { return attemptDoc(a) })
	return d
}

func (d runDoc) record() store.Run {
	r := store.Run{Run: api.Run{
		ID: d.ID,
		RunSpec: api.RunSpec{
			Image: d.Image, Command: d.Command, Env: d.Env, CPU: d.CPU,
			MemoryBytes: d.MemoryBytes, TimeoutSeconds: d.TimeoutSeconds, Retries: d.Retries,
			GPUs: d.GPUs, GPUModel: d.GPUModel, GPUMemoryBytes: d.GPUMemoryBytes,
			ReplaceAfterSeconds: d.ReplaceAfterSeconds,
			User:                d.User, ReadOnlyRootfs: d.ReadOnlyRootfs, Network: d.Network, PidsLimit: d.PidsLimit,
			LogLimitBytes: d.LogLimitBytes, Project: d.Project, Priority: d.Priority, GraceSeconds: d.GraceSeconds, Constraints: d.Constraints,
			Nodes: d.Nodes, MasterPort: d.MasterPort,
		},
		PinnedImage: d.PinnedImage, Status: d.Status, Reason: d.Reason, ExitCode: d.ExitCode,
		Cancel: d.Cancel, CreatedAt: d.CreatedAt, UpdatedAt: d.UpdatedAt, FinishedAt: d.FinishedAt,
	}, NextCheck: d.NextCheck, SealedSecrets: d.SealedSecrets, Submission: d.Submission}
	r.Secrets = store.RedactedSecrets(d.SealedSecrets)
	r.Artifacts = convertAll(d.Artifacts, func(m artifactMountDoc) api.ArtifactMount { return api.ArtifactMount(m) })
	r.Attempts = convertAll(d.Attempts, func(a attemptDoc) api.Attempt { return api.Attempt(a) })
	return r
}

// convertAll converts every element of xs, keeping nil as nil (a stored
// "attempts": null reads back as it was written).
func convertAll[X, Y any](xs []X, convert func(X) Y) []Y {
	if xs == nil {
		return nil
	}
	ys := make([]Y, len(xs))
	for i, x := range xs {
		ys[i] = convert(x)
	}
	return ys
}

// artifactVersionDoc is an api.ArtifactVersion as stored.
type artifactVersionDoc struct {
	Name      string    `json:"name"`
	Version   string    `json:"version"`
	SHA256    string    `json:"sha256"`
	Size      int64     `json:"size"`
	Format    string    `json:"format"`
	CreatedAt time.Time `json:"created_at"`
	Project   string    `json:"project,omitempty"`
}

// artifactDoc is a store.Artifact as stored.
type artifactDoc struct {
	artifactVersionDoc
	Seq int `json:"seq"`
}

// projectDoc is an api.Project as stored.
type projectDoc struct {
	Name        string         `json:"name"`
	GPUs        map[string]int `json:"quota_gpus,omitempty"`
	CPU         float64        `json:"quota_cpu,omitempty"`
	MemoryBytes int64          `json:"quota_memory_bytes,omitempty"`
	MaxRunning  int            `json:"max_running,omitempty"`
	Weight      float64        `json:"weight,omitempty"`
	Pools       []string       `json:"pools,omitempty"`
	CreatedAt   time.Time      `json:"created_at"`
	UpdatedAt   time.Time      `json:"updated_at"`
}

func projectDocOf(p store.Project) projectDoc {
	return projectDoc{Name: p.Name, GPUs: p.Quota.GPUs, CPU: p.Quota.CPU, MemoryBytes: p.Quota.MemoryBytes,
		MaxRunning: p.MaxRunning, Weight: p.Weight, Pools: p.Pools, CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt}
}

func (d projectDoc) record() store.Project {
	return store.Project{Project: api.Project{Name: d.Name, Quota: api.Quota{GPUs: d.GPUs, CPU: d.CPU, MemoryBytes: d.MemoryBytes},
		MaxRunning: d.MaxRunning, Weight: d.Weight, Pools: d.Pools, CreatedAt: d.CreatedAt, UpdatedAt: d.UpdatedAt}}
}
