package api

import (
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/mercator/mercator/failure"
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
	return ValidateArtifactMounts(s.Artifacts)
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
		return failure.Invalid("cpu", "must be a number of cores from 0 (no limit) to %d, such as 0.5", MaxRunCPU)
	case s.MemoryBytes < 0 || s.MemoryBytes > MaxRunMemory:
		return failure.Invalid("memory_bytes", "must be from 0 (no limit) to %d bytes", int64(MaxRunMemory))
	case s.MemoryBytes > 0 && s.MemoryBytes < MinRunMemory:
		return failure.Invalid("memory_bytes", "must be at least 6 MiB (%d bytes), the container runtime's minimum, or 0 for no limit", MinRunMemory)
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
	if total > MaxRunStringBytes {
		return failure.Invalid("command", "command and environment total %d bytes; at most %d are accepted", total, MaxRunStringBytes)
	}
	return nil
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
