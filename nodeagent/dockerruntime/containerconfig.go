package dockerruntime

import (
	"cmp"
	"math"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// containerConfig is the container one launch asks the daemon for, built
// from the command, this runtime's node label ("" for none) and where the
// node keeps each Artifact's content (artifactPath, by digest; called only
// for a launch with Artifacts). It is a pure function, as Nomad's Docker
// driver builds its createContainerConfig, so everything a launch asks of
// the daemon is tested without one:
//
//   - the pinned image, the command as the container's arguments (an
//     image's ENTRYPOINT applies; without one the first element is the
//     program), and the environment (Env and the run's secrets:
//     LaunchWorkloadCommand.Environment) sorted, so one command always
//     asks for the same container. The daemon keeps a container's
//     environment in its configuration on its disk (docs/hardening.md,
//     "Run secrets"), the one place on the node a secret is written;
//   - the labels that make the container this attempt's on this node
//     (dockerengine.LabelRun, dockerengine.LabelAttempt, dockerengine.LabelNode, dockerengine.LabelTimeout, dockerengine.LabelImage, and
//     dockerengine.LabelArtifacts naming the mounted digests);
//   - every Artifact bind-mounted read-only at its mount path;
//   - CPU as a CFS quota (NanoCPUs), MemoryBytes as a hard limit with swap
//     included, each the node's default (contain) when the command states
//     none, and GPUs handed to the NVIDIA runtime by UUID;
//   - the node's containment (dockerengine.Containment.Apply): capabilities
//     dropped, no-new-privileges, never privileged, a process limit (the
//     command's PidsLimit up to contain.MaxPidsLimit, else the node's),
//     and a json-file log rotated at contain.LogMaxBytes;
//   - what the command asked for: its User, a read-only root filesystem,
//     and the "none" network.
//
// Nothing else reaches the host: the only mounts are the Artifacts', read
// only, from where the node keeps them; the only devices are the GPUs the
// scheduler assigned. A command that cannot make a container is
// failure.ErrInvalid, naming the field.
func containerConfig(command nodeproto.LaunchWorkloadCommand, nodeID string, contain dockerengine.Containment, artifactPath func(digest string) string) (*container.Config, *container.HostConfig, error) {
	if err := checkLaunch(command, contain); err != nil {
		return nil, nil, err
	}
	ref, err := pinnedImage(command.Image)
	if err != nil {
		return nil, nil, err
	}
	env, err := containerEnv(command.Environment()) // Env and the run's secrets
	if err != nil {
		return nil, nil, err
	}
	mounts, digests, err := artifactMounts(command.Artifacts, artifactPath)
	if err != nil {
		return nil, nil, err
	}
	labels := map[string]string{
		dockerengine.LabelRun:     command.RunID,
		dockerengine.LabelAttempt: strconv.Itoa(command.Attempt),
		dockerengine.LabelTimeout: strconv.FormatInt(int64(max(command.Timeout, 0)), 10),
		dockerengine.LabelImage:   ref,
	}
	if nodeID != "" {
		labels[dockerengine.LabelNode] = nodeID
	}
	if len(digests) > 0 {
		labels[dockerengine.LabelArtifacts] = strings.Join(digests, ",")
	}
	config := &container.Config{Image: ref, Cmd: command.Command, Env: env, Labels: labels, User: command.User}
	hostConfig := &container.HostConfig{Mounts: mounts, LogConfig: contain.RunLogConfig(),
		ReadonlyRootfs: command.ReadOnlyRootfs, NetworkMode: container.NetworkMode(command.Network)}
	contain.Apply(hostConfig, command.PidsLimit)
	if cpu := cmp.Or(command.CPU, contain.DefaultCPU); cpu > 0 {
		hostConfig.NanoCPUs = int64(math.Round(cpu * 1e9))
	}
	if memory := cmp.Or(command.MemoryBytes, contain.DefaultMemoryBytes); memory > 0 {
		hostConfig.Memory = memory
		hostConfig.MemorySwap = memory
	}
	if len(command.GPUs) > 0 {
		hostConfig.DeviceRequests = []container.DeviceRequest{{
			Driver:       "nvidia",
			DeviceIDs:    slices.Clone(command.GPUs),
			Capabilities: [][]string{{"gpu"}},
		}}
	}
	return config, hostConfig, nil
}

// checkLaunch refuses the fields no container can be made from, and the
// containment this node does not grant: a network other than the default
// and "none", a user that is not a name or number, more processes than
// contain.MaxPidsLimit. The control plane checks the same (api.RunSpec),
// and this node checks again, because it is what holds the machine.
func checkLaunch(command nodeproto.LaunchWorkloadCommand, contain dockerengine.Containment) error {
	switch {
	case !command.NetworkAllowed():
		return failure.Invalid("network", "%q is not a network this node gives a run: only \"none\", the default, or \"host\" for a gang's member", command.Network)
	case command.User != "" && !nodeproto.ValidUser(command.User):
		return failure.Invalid("user", "%q is not a user name or uid[:gid]", command.User)
	case command.PidsLimit < 0 || command.PidsLimit > contain.MaxPidsLimit:
		return failure.Invalid("pids_limit", "%d processes asked for; this node allows from 1 to %d (its --max-pids)", command.PidsLimit, contain.MaxPidsLimit)
	case command.RunID == "":
		return failure.Invalid("run_id", "a launch needs a run ID")
	case command.Attempt < 0:
		return failure.Invalid("attempt", "attempt %d is negative", command.Attempt)
	case command.CPU < 0 || math.IsNaN(command.CPU) || math.IsInf(command.CPU, 0):
		return failure.Invalid("cpu", "%v is not a number of cores", command.CPU)
	case command.MemoryBytes < 0:
		return failure.Invalid("memory_bytes", "%d is negative", command.MemoryBytes)
	}
	return nil
}

// containerEnv turns the command's environment into the daemon's form,
// sorted so the same command always creates the same container.
func containerEnv(vars map[string]string) ([]string, error) {
	if len(vars) == 0 {
		return nil, nil
	}
	env := make([]string, 0, len(vars))
	for name, value := range vars {
		if name == "" || strings.ContainsAny(name, "=\x00") {
			return nil, failure.Invalid("env", "%q is not an environment variable name", name)
		}
		env = append(env, name+"="+value)
	}
	sort.Strings(env)
	return env, nil
}

// artifactMounts is one read-only bind mount per Artifact, in the command's
// order, and the distinct digests they mount, in first-mention order. A
// mount path must be absolute, clean, not / and unique within the launch.
func artifactMounts(artifacts []nodeproto.ArtifactMount, artifactPath func(digest string) string) ([]mount.Mount, []string, error) {
	var mounts []mount.Mount
	var digests []string
	seen, targets := map[string]bool{}, map[string]bool{}
	for _, a := range artifacts {
		target := path.Clean(a.MountPath)
		if !path.IsAbs(a.MountPath) || target == "/" || target != a.MountPath || targets[target] {
			return nil, nil, failure.Invalid("artifacts", "artifact %s: mount path %q must be absolute, clean, not / and unique", a.Ref(), a.MountPath)
		}
		targets[target] = true
		if !seen[a.SHA256] {
			seen[a.SHA256] = true
			digests = append(digests, a.SHA256)
		}
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: artifactPath(a.SHA256), Target: target, ReadOnly: true})
	}
	return mounts, digests, nil
}
