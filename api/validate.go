package api

import (
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// Limits on a run spec. They reject the absurd, not the large: a 2 TiB
// memory limit is a real machine; a negative one or a NaN CPU is a bug in
// the caller.
const (
	MaxRunCPU         = 1024
	MinRunMemory      = 6 << 20 // the Docker daemon's own minimum
	MaxRunMemory      = 1 << 50
	MaxRunTimeout     = 30 * 24 * 3600 // seconds
	MaxRunRetries     = 100
	MaxRunGPUs        = 64
	MaxRunArgs        = 4096
	MaxRunEnv         = 1024
	MaxRunStringBytes = 128 << 10
	// MaxRunArtifacts bounds the Artifacts of one run.
	MaxRunArtifacts = 64
	// MinRunLogLimit and MaxRunLogLimit bound LogLimitBytes when set; a
	// control plane's own maximum is usually lower.
	MinRunLogLimit = 4 << 10
	MaxRunLogLimit = 1 << 40
	// MaxRunSecrets bounds the Secrets of one run, and MaxRunSecretBytes
	// one secret's value: room for a PEM key or a kubeconfig, while a
	// whole "NAME=VALUE" stays well under the kernel's 128 KiB limit on
	// one environment string. Names and values also count towards
	// MaxRunStringBytes with the command and the environment.
	MaxRunSecrets     = 64
	MaxRunSecretBytes = 32 << 10
	// MaxRunPidsLimit is the kernel's own ceiling on process IDs; each
	// node refuses a limit above its configured maximum, usually far lower.
	MaxRunPidsLimit = 1 << 22
)

var (
	envName         = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	artifactName    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	artifactVersion = regexp.MustCompile(`^v[1-9][0-9]{0,8}$`)
	sha256Pattern   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Normalized returns a copy of s in the form the control plane stores: the
// image reference without surrounding spaces. It does not change s.
func (s RunSpec) Normalized() RunSpec {
	s.Image = strings.TrimSpace(s.Image)
	return s
}

// Validate checks a run spec and returns a failure.ErrInvalid error naming
// the first field at fault and what to write instead, or nil. It is pure:
// it reads s and changes nothing, so the CLI (before it sends a spec) and
// the control plane (before it stores one) call the same checks. It checks
// the image reference's syntax only, as Normalized would store it; whether
// the image exists is the resolver's question, and whether each Artifact
// version exists is the control plane's.
func (s RunSpec) Validate() error {
	if err := s.validateLimits(); err != nil {
		return err
	}
	if err := s.validateStrings(); err != nil {
		return err
	}
	if err := s.validateContainment(); err != nil {
		return err
	}
	if err := s.validateTeams(); err != nil {
		return err
	}
	return ValidateArtifactMounts(s.Artifacts)
}

// validateContainment checks what the spec asks of the container's
// containment: a user by name or number, a network that is the default or
// none, and a process limit within the kernel's range.
func (s RunSpec) validateContainment() error {
	switch {
	case s.User != "" && !nodeproto.ValidUser(s.User):
		return failure.Invalid("user", "%q is not a user: write a name or uid, optionally with a group, such as 1000 or 1000:1000", s.User)
	case s.Network == NetworkHost && s.Nodes <= 1:
		return failure.Invalid("network", "only a gang's members (nodes 2 or more) get the host's network, which NCCL between machines needs; use \"none\" for loopback only, or leave it empty for the node's bridge")
	case s.Network != "" && s.Network != NetworkNone && s.Network != NetworkHost:
		return failure.Invalid("network", "%q is not a network a run may ask for: use \"none\" for loopback only, or leave it empty for the node's bridge", s.Network)
	case s.PidsLimit < 0 || s.PidsLimit > MaxRunPidsLimit:
		return failure.Invalid("pids_limit", "must be from 0 (the node's limit) to %d processes", MaxRunPidsLimit)
	}
	return nil
}

// validateLimits checks the image, the command's presence and every
// numeric field against its range.
func (s RunSpec) validateLimits() error {
	switch {
	case strings.TrimSpace(s.Image) == "":
		return failure.Invalid("image", "is required, for example 127.0.0.1:5000/hello:1")
	case len(s.Command) == 0:
		return failure.Invalid("command", "is required: the program to run and its arguments, for example [\"/hello\", \"world\"]")
	case len(s.Command) > MaxRunArgs:
		return failure.Invalid("command", "has %d arguments; at most %d are accepted", len(s.Command), MaxRunArgs)
	case s.Command[0] == "":
		return failure.Invalid("command", "the program (first element) must not be empty")
	case math.IsNaN(s.CPU) || math.IsInf(s.CPU, 0) || s.CPU < 0 || s.CPU > MaxRunCPU:
		return failure.Invalid("cpu", "must be a number of cores from 0 (the node's default) to %d, such as 0.5", MaxRunCPU)
	case s.MemoryBytes < 0 || s.MemoryBytes > MaxRunMemory:
		return failure.Invalid("memory_bytes", "must be from 0 (the node's default) to %d bytes", int64(MaxRunMemory))
	case s.MemoryBytes > 0 && s.MemoryBytes < MinRunMemory:
		return failure.Invalid("memory_bytes", "must be at least 6 MiB (%d bytes), the container runtime's minimum, or 0 for the node's default", MinRunMemory)
	case s.TimeoutSeconds < 0 || s.TimeoutSeconds > MaxRunTimeout:
		return failure.Invalid("timeout_seconds", "must be from 0 (none) to %d (30 days)", MaxRunTimeout)
	case s.Retries < 0 || s.Retries > MaxRunRetries:
		return failure.Invalid("retries", "must be from 0 to %d", MaxRunRetries)
	case s.GPUs < 0 || s.GPUs > MaxRunGPUs:
		return failure.Invalid("gpus", "must be from 0 to %d", MaxRunGPUs)
	case s.GPUs == 0 && (s.GPUModel != "" || s.GPUMemoryBytes != 0):
		return failure.Invalid("gpus", "gpu_model and gpu_memory_bytes need gpus of 1 or more")
	case s.GPUMemoryBytes < 0 || s.GPUMemoryBytes > MaxRunMemory:
		return failure.Invalid("gpu_memory_bytes", "must be from 0 (any) to %d bytes", int64(MaxRunMemory))
	case len(s.GPUModel) > 128 || strings.ContainsAny(s.GPUModel, "\x00\n"):
		return failure.Invalid("gpu_model", "must be a model name such as H100, at most 128 characters on one line")
	case s.ReplaceAfterSeconds > MaxRunTimeout:
		return failure.Invalid("replace_after_seconds", "must be at most %d (30 days), 0 for the default or negative for never", MaxRunTimeout)
	case s.LogLimitBytes != 0 && (s.LogLimitBytes < MinRunLogLimit || s.LogLimitBytes > MaxRunLogLimit):
		return failure.Invalid("log_limit_bytes", "must be from %d (4 KiB) to %d (1 TiB) bytes, or 0 for the control plane's default", MinRunLogLimit, int64(MaxRunLogLimit))
	case len(s.Env) > MaxRunEnv:
		return failure.Invalid("env", "has %d variables; at most %d are accepted", len(s.Env), MaxRunEnv)
	case len(s.Secrets) > MaxRunSecrets:
		return failure.Invalid("secrets", "has %d secrets; at most %d are accepted", len(s.Secrets), MaxRunSecrets)
	}
	return s.validateGang()
}

// validateGang checks a gang's size and rendezvous port (issue 18).
func (s RunSpec) validateGang() error {
	switch {
	case s.Nodes < 0 || s.Nodes > MaxRunNodes:
		return failure.Invalid("nodes", "must be from 1 to %d members (0 means 1), got %d", MaxRunNodes, s.Nodes)
	case s.MasterPort < 0 || s.MasterPort > 65535:
		return failure.Invalid("master_port", "must be a TCP port from 1 to 65535, or 0 for %d", DefaultMasterPort)
	case s.MasterPort != 0 && s.Nodes <= 1:
		return failure.Invalid("master_port", "is the rendezvous port of a gang; set nodes to 2 or more, or leave it out")
	}
	return nil
}

// validateStrings checks the command's arguments and the environment's
// names and values, and their total size.
func (s RunSpec) validateStrings() error {
	total := 0
	for _, a := range s.Command {
		if strings.ContainsRune(a, 0) {
			return failure.Invalid("command", "arguments must not contain NUL bytes")
		}
		total += len(a)
	}
	for k, v := range s.Env {
		if !envName.MatchString(k) {
			return failure.Invalid("env", "%q is not a valid variable name: use letters, digits and '_', not starting with a digit", k)
		}
		if strings.ContainsRune(v, 0) {
			return failure.Invalid("env", "the value of %s contains a NUL byte", k)
		}
		total += len(k) + len(v)
	}
	n, err := s.validateSecrets()
	if err != nil {
		return err
	}
	if total += n; total > MaxRunStringBytes {
		return failure.Invalid("command", "command, environment and secrets total %d bytes; at most %d are accepted", total, MaxRunStringBytes)
	}
	return nil
}

// validateSecrets checks the secrets' names (as env names, and not also in
// Env) and values, and returns their total size. Its errors name a secret,
// never show its value.
func (s RunSpec) validateSecrets() (int, error) {
	total := 0
	for k, v := range s.Secrets {
		field := "secrets." + k
		switch _, inEnv := s.Env[k]; {
		case !envName.MatchString(k):
			return 0, failure.Invalid("secrets", "%q is not a valid variable name: use letters, digits and '_', not starting with a digit", k)
		case inEnv:
			return 0, failure.Invalid(field, "is also set in env; a name is either a secret or a plain variable, so remove it from one of them")
		case v == SecretRedacted:
			return 0, failure.Invalid(field, "is %q, what a read shows in place of a secret, not a value: give the secret itself (run submit --secret-file %s=PATH)", SecretRedacted, k)
		case len(v) > MaxRunSecretBytes:
			return 0, failure.Invalid(field, "is %d bytes; a secret may be at most %d (put larger material in an Artifact, and its key in a secret)", len(v), MaxRunSecretBytes)
		case strings.ContainsRune(v, 0):
			return 0, failure.Invalid(field, "contains a NUL byte, which an environment variable cannot hold (base64-encode binary secrets)")
		case !utf8.ValidString(v):
			return 0, failure.Invalid(field, "is not UTF-8 text, which is all a JSON string carries intact (base64-encode binary secrets)")
		}
		total += len(k) + len(v)
	}
	return total, nil
}

// ValidateArtifactName checks an Artifact's name, reporting it as field.
func ValidateArtifactName(field, name string) error {
	if !artifactName.MatchString(name) {
		return failure.Invalid(field, "%q is not an artifact name: use letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128 characters", name)
	}
	return nil
}

// ValidateArtifactMounts checks a run's Artifacts: names, versions, mount
// paths (absolute, clean, not /, unique) and floors. Whether each version
// exists is the control plane's question.
func ValidateArtifactMounts(mounts []ArtifactMount) error {
	if len(mounts) > MaxRunArtifacts {
		return failure.Invalid("artifacts", "has %d entries; at most %d are accepted", len(mounts), MaxRunArtifacts)
	}
	seen := map[string]string{}
	for i, m := range mounts {
		field := fmt.Sprintf("artifacts[%d]", i)
		if err := ValidateArtifactName(field+".name", m.Name); err != nil {
			return err
		}
		if m.Version != "" && m.Version != "latest" && !artifactVersion.MatchString(m.Version) {
			return failure.Invalid(field+".version", "%q is not a version: versions are v1, v2, …, or empty for the newest", m.Version)
		}
		if err := validateMountPath(field+".mount_path", m); err != nil {
			return err
		}
		if other, dup := seen[m.MountPath]; dup {
			return failure.Invalid(field+".mount_path", "%q is also the mount path of %s; every artifact needs its own", m.MountPath, other)
		}
		seen[m.MountPath] = m.Name
		if m.MinReadBytesPerSecond < 0 {
			return failure.Invalid(field+".min_read_bytes_per_second", "must be 0 (no floor) or more, not %d", m.MinReadBytesPerSecond)
		}
		if m.SHA256 != "" && !sha256Pattern.MatchString(m.SHA256) {
			return failure.Invalid(field+".sha256", "%q is not a SHA-256 digest", m.SHA256)
		}
	}
	return nil
}

// validateMountPath checks where one Artifact appears in the container.
func validateMountPath(field string, m ArtifactMount) error {
	p := m.MountPath
	switch {
	case p == "":
		return failure.Invalid(field, "is required: where %s appears in the container, for example /data", m.Name)
	case !strings.HasPrefix(p, "/"):
		return failure.Invalid(field, "%q must be an absolute path, such as /data", p)
	case strings.ContainsAny(p, "\x00:,"):
		return failure.Invalid(field, "%q must not contain NUL, ':' or ','", p)
	case p == "/" || path.Clean(p) == "/":
		return failure.Invalid(field, "must not be /: an artifact cannot replace the container's root")
	case slices.Contains(strings.Split(p, "/"), ".."):
		return failure.Invalid(field, "%q must not contain \"..\"", p)
	case path.Clean(p) != p:
		return failure.Invalid(field, "%q is not clean; write %q", p, path.Clean(p))
	case len(p) > 1024:
		return failure.Invalid(field, "is longer than 1024 bytes")
	}
	return nil
}

// validateTeams checks the project and priority a run asks for (issue 17).
func (s RunSpec) validateTeams() error {
	if s.Project != "" {
		if err := ValidateProjectName("project", s.Project); err != nil {
			return err
		}
	}
	if s.Priority < -MaxRunPriority || s.Priority > MaxRunPriority {
		return failure.Invalid("priority", "%d: must be from %d to %d", s.Priority, -MaxRunPriority, MaxRunPriority)
	}
	if err := ValidateLabels("constraints", s.Constraints); err != nil {
		return err
	}
	if s.GraceSeconds < 0 || s.GraceSeconds > MaxRunGrace {
		return failure.Invalid("grace_seconds", "%d: must be from 0 (the default, 10 s) to %d (an hour); a control plane's own maximum may be lower", s.GraceSeconds, MaxRunGrace)
	}
	return nil
}
