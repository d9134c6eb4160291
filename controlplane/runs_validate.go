package controlplane

import (
	"math"
	"regexp"
	"strings"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
)

// Limits on a run spec. They reject the absurd, not the large: a 2 TiB
// memory limit is a real machine; a negative one or a NaN CPU is a bug in
// the caller.
const (
	maxCPU         = 1024
	minMemory      = 6 << 20 // the Docker daemon's own minimum
	maxMemory      = 1 << 50
	maxTimeout     = 30 * 24 * 3600
	maxRetries     = 100
	maxGPUs        = 64
	maxArgs        = 4096
	maxEnv         = 1024
	maxStringBytes = 128 << 10
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateRunSpec checks a run spec, naming the first field at fault. It
// checks the image reference's syntax only; whether the image exists is the
// resolver's question.
func ValidateRunSpec(spec *api.RunSpec) error {
	spec.Image = strings.TrimSpace(spec.Image)
	switch {
	case spec.Image == "":
		return failure.Invalid("image", "is required, for example 127.0.0.1:5000/hello:1")
	case len(spec.Command) == 0:
		return failure.Invalid("command", "is required: the program to run and its arguments, for example [\"/hello\", \"world\"]")
	case len(spec.Command) > maxArgs:
		return failure.Invalid("command", "has %d arguments; at most %d are accepted", len(spec.Command), maxArgs)
	case spec.Command[0] == "":
		return failure.Invalid("command", "the program (first element) must not be empty")
	case math.IsNaN(spec.CPU) || math.IsInf(spec.CPU, 0) || spec.CPU < 0 || spec.CPU > maxCPU:
		return failure.Invalid("cpu", "must be a number of cores from 0 (no limit) to %d, such as 0.5", maxCPU)
	case spec.MemoryBytes < 0 || spec.MemoryBytes > maxMemory:
		return failure.Invalid("memory_bytes", "must be from 0 (no limit) to %d bytes", int64(maxMemory))
	case spec.MemoryBytes > 0 && spec.MemoryBytes < minMemory:
		return failure.Invalid("memory_bytes", "must be at least 6 MiB (%d bytes), the container runtime's minimum, or 0 for no limit", minMemory)
	case spec.TimeoutSeconds < 0 || spec.TimeoutSeconds > maxTimeout:
		return failure.Invalid("timeout_seconds", "must be from 0 (none) to %d (30 days)", maxTimeout)
	case spec.Retries < 0 || spec.Retries > maxRetries:
		return failure.Invalid("retries", "must be from 0 to %d", maxRetries)
	case spec.GPUs < 0 || spec.GPUs > maxGPUs:
		return failure.Invalid("gpus", "must be from 0 to %d", maxGPUs)
	case spec.GPUs == 0 && (spec.GPUModel != "" || spec.GPUMemoryBytes != 0):
		return failure.Invalid("gpus", "gpu_model and gpu_memory_bytes need gpus of 1 or more")
	case spec.GPUMemoryBytes < 0 || spec.GPUMemoryBytes > maxMemory:
		return failure.Invalid("gpu_memory_bytes", "must be from 0 (any) to %d bytes", int64(maxMemory))
	case len(spec.GPUModel) > 128 || strings.ContainsAny(spec.GPUModel, "\x00\n"):
		return failure.Invalid("gpu_model", "must be a model name such as H100, at most 128 characters on one line")
	case spec.ReplaceAfterSeconds > maxTimeout:
		return failure.Invalid("replace_after_seconds", "must be at most %d (30 days), 0 for the default or negative for never", maxTimeout)
	case len(spec.Env) > maxEnv:
		return failure.Invalid("env", "has %d variables; at most %d are accepted", len(spec.Env), maxEnv)
	}
	total := 0
	for _, a := range spec.Command {
		if strings.ContainsRune(a, 0) {
			return failure.Invalid("command", "arguments must not contain NUL bytes")
		}
		total += len(a)
	}
	for k, v := range spec.Env {
		if !envName.MatchString(k) {
			return failure.Invalid("env", "%q is not a valid variable name: use letters, digits and '_', not starting with a digit", k)
		}
		if strings.ContainsRune(v, 0) {
			return failure.Invalid("env", "the value of %s contains a NUL byte", k)
		}
		total += len(k) + len(v)
	}
	if total > maxStringBytes {
		return failure.Invalid("command", "command and environment total %d bytes; at most %d are accepted", total, maxStringBytes)
	}
	return validateArtifactMounts(spec.Artifacts)
}
