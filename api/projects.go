package api

import (
	"math"
	"regexp"
	"strings"
	"time"

	"github.com/mercator/mercator/failure"
)

// DefaultProject is the project a run, app or credential belongs to when it
// names none. It always exists: listed and readable even before anyone
// stores it, and it cannot be removed.
const DefaultProject = "default"

// Limits on a project. Like a run spec's, they reject the absurd: a quota
// of 100,000 GPUs of one model is a large fleet; a negative one is a typo.
const (
	MaxProjects         = 1000 // projects a control plane keeps
	MaxProjectGPUModels = 16   // models named in one quota
	MaxProjectGPUs      = 1 << 20
	MaxProjectCPU       = 1 << 24
	MaxProjectMemory    = 1 << 60
	MaxProjectRunning   = 1 << 24
	MaxProjectWeight    = 1000
	MaxProjectPools     = 16
	// MaxRunPriority bounds RunSpec.Priority either way.
	MaxRunPriority = 1_000_000
	// MaxRunGrace bounds RunSpec.GraceSeconds, in seconds.
	MaxRunGrace = 3600
	// MaxLabels bounds a node's labels and a run's constraints.
	MaxLabels = 32
)

var (
	projectName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	// gpuModelKey is a quota's GPU model: a word a device's model name
	// contains ("H100", "A100-80GB").
	gpuModelKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	poolName    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
)

// Quota is what a project is guaranteed: GPUs by model, CPU cores and
// memory. A resource it does not name is guaranteed at zero, so the
// project runs such work only on capacity nobody else needs (borrowed).
type Quota struct {
	// GPUs maps a model word, matched case-insensitively against a
	// device's model name ("H100" matches "NVIDIA H100 80GB HBM3"), to a
	// number of devices.
	GPUs        map[string]int `json:"gpus,omitempty"`
	CPU         float64        `json:"cpu,omitempty"`
	MemoryBytes int64          `json:"memory_bytes,omitempty"`
}

// Project is a team's share of the fleet: the body of POST /v1/projects
// and PUT /v1/projects/{name}, and what reads show (docs/teams.md).
type Project struct {
	Name  string `json:"name"`
	Quota Quota  `json:"quota"`
	// MaxRunning, when positive, caps the project's running and placed
	// runs, borrowed or not.
	MaxRunning int `json:"max_running,omitempty"`
	// Weight is the project's share of what is borrowed, against the
	// others' (fair share); 0 reads as 1.
	Weight float64 `json:"weight,omitempty"`
	// Pools, when set, restricts the project's work to nodes whose "pool"
	// label is one of them.
	Pools     []string  `json:"pools,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// FunctionReservations is, by node, what the containers of the
	// project's functions hold there (they count against its quota):
	// shown by GET /v1/projects/{name} only, ignored in a request.
	FunctionReservations []FunctionReservation `json:"function_reservations,omitempty"`
}

// FunctionReservation is what one project's function containers hold on
// one node, as its agent last reported them: each idle, busy or starting
// container reserves its function's CPU and memory in the node's function
// share.
type FunctionReservation struct {
	Node        string  `json:"node"`
	Containers  int     `json:"containers"`
	CPU         float64 `json:"cpu"`
	MemoryBytes int64   `json:"memory_bytes"`
}

// ProjectList is the body of GET /v1/projects, ordered by name; the
// default project is always in it.
type ProjectList struct {
	Projects []Project `json:"projects"`
}

// ValidateProjectName checks a project's name: lower-case letters, digits
// and dashes, up to 63, starting with a letter or digit (it appears in
// node labels, reasons and URLs).
func ValidateProjectName(field, name string) error {
	if !projectName.MatchString(name) {
		return failure.Invalid(field, "%q is not a project name: use up to 63 lower-case letters, digits and dashes, starting with a letter or digit", name)
	}
	return nil
}

// Validate checks a project as submitted, naming the first field at fault.
// It is pure, shared by the CLI and the control plane.
func (p Project) Validate() error {
	if err := ValidateProjectName("name", p.Name); err != nil {
		return err
	}
	if len(p.Quota.GPUs) > MaxProjectGPUModels {
		return failure.Invalid("quota.gpus", "%d GPU models; at most %d", len(p.Quota.GPUs), MaxProjectGPUModels)
	}
	for model, n := range p.Quota.GPUs {
		if !gpuModelKey.MatchString(model) {
			return failure.Invalid("quota.gpus", "%q is not a GPU model word: write one a device's model contains, such as H100 or A100", model)
		}
		if n < 0 || n > MaxProjectGPUs {
			return failure.Invalid("quota.gpus", "%s=%d: want 0 to %d devices", model, n, MaxProjectGPUs)
		}
	}
	for model := range p.Quota.GPUs {
		for other := range p.Quota.GPUs {
			if model != other && strings.Contains(strings.ToLower(other), strings.ToLower(model)) {
				return failure.Invalid("quota.gpus", "%q contains %q, so a device would count against both: name each model once", other, model)
			}
		}
	}
	if math.IsNaN(p.Quota.CPU) || p.Quota.CPU < 0 || p.Quota.CPU > MaxProjectCPU {
		return failure.Invalid("quota.cpu", "%g: want 0 to %d cores", p.Quota.CPU, MaxProjectCPU)
	}
	if p.Quota.MemoryBytes < 0 || p.Quota.MemoryBytes > MaxProjectMemory {
		return failure.Invalid("quota.memory_bytes", "%d: want 0 to %d bytes", p.Quota.MemoryBytes, int64(MaxProjectMemory))
	}
	if p.MaxRunning < 0 || p.MaxRunning > MaxProjectRunning {
		return failure.Invalid("max_running", "%d: want 0 (no cap) to %d", p.MaxRunning, MaxProjectRunning)
	}
	if math.IsNaN(p.Weight) || p.Weight < 0 || p.Weight > MaxProjectWeight {
		return failure.Invalid("weight", "%g: want a weight above 0 and at most %d (0 means 1)", p.Weight, MaxProjectWeight)
	}
	if len(p.Pools) > MaxProjectPools {
		return failure.Invalid("pools", "%d pools; at most %d", len(p.Pools), MaxProjectPools)
	}
	for _, pool := range p.Pools {
		if !poolName.MatchString(pool) {
			return failure.Invalid("pools", "%q is not a pool name: letters, digits, '.', '_' and '-', up to 63", pool)
		}
	}
	return nil
}

// EffectiveWeight is Weight with 0 read as 1.
func (p Project) EffectiveWeight() float64 {
	if p.Weight == 0 {
		return 1
	}
	return p.Weight
}

// ProjectOf is the project a spec names, DefaultProject when none.
func ProjectOf(name string) string {
	if name == "" {
		return DefaultProject
	}
	return name
}

// labelPart is a label's key or value: letters, digits, '.', '_', '-' and
// '/', up to 63, starting with a letter or digit.
var labelPart = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)

// ValidateLabels checks labels or constraints: at most MaxLabels, each key
// and value a labelPart.
func ValidateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return failure.Invalid(field, "%d labels; at most %d", len(labels), MaxLabels)
	}
	for k, v := range labels {
		if !labelPart.MatchString(k) || !labelPart.MatchString(v) {
			return failure.Invalid(field, "%q=%q: keys and values are letters, digits, '.', '_', '-' and '/', up to 63, starting with a letter or digit", k, v)
		}
	}
	return nil
}
