package dockerruntime

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// LaunchWorkload starts one container and returns once it is running. The
// container's name is derived from the run and attempt, so the daemon itself
// refuses a second container for the same attempt even if the agent's own
// memory were lost.
//
// That refusal is answered by adoption, not failure: when the name is taken
// by a container whose labels say it is this attempt on this node, the
// launch is the one already made. A container still "created" (the agent
// died between create and start) is started; one that is running or has
// exited is left alone and the launch succeeds, because starting an exited
// attempt again would be the second run that (docs/design.md, promise 1) forbids. A name taken by
// anything else is failure.ErrConflict.
//
// What the container is made of is containerConfig's (containerconfig.go):
// the image must be pinned, Artifacts are mounted read-only, CPU, memory and
// GPUs are limits, and the node's containment applies (WithContainment). The image is expected to be held already (the agent's
// image step ran PrepareImage); one the daemon lacks is pulled once and the
// create made again, so a launch on its own still works. Its Artifacts are
// prepared (or awaited, when a prepare of them is under way) and pinned
// until the container exists, so no eviction removes a copy between its
// preparation and the container that mounts it. The container is never
// removed on exit: its exit code and the daemon's start and finish moments
// are what Observe reports, after a partition if need be.
//
// A container that is created but will not start comes back as an error
// saying so in Mercator's words and the daemon's ("start container
// mercator-r1-1: executable "/nope" not found in image"); a missing or
// unexecutable program matches failure.ErrInvalid, because retrying the
// same command cannot succeed. The container is left in place, and Observe
// reports it failed.
func (docker *Runtime) LaunchWorkload(ctx context.Context, command nodeproto.LaunchWorkloadCommand) error {
	config, hostConfig, err := containerConfig(command, docker.nodeID, docker.contain, docker.artifacts.Path)
	if err != nil {
		return err
	}
	release, err := docker.artifacts.Hold(ctx, command.Artifacts)
	if err != nil {
		return err
	}
	defer release()
	return docker.create(ctx, command, config, hostConfig)
}

// create makes the attempt's container and starts it, adopting one that
// already carries its name and labels. Two rounds at most: a conflicting
// container removed between the create and the adoption's inspect frees the
// name for one more create. An image the daemon lacks is pulled once.
func (docker *Runtime) create(ctx context.Context, command nodeproto.LaunchWorkloadCommand, config *container.Config, hostConfig *container.HostConfig) error {
	name := ContainerName(command.WorkloadKey)
	pulled, recreated := false, false
	for {
		created, err := docker.api.ContainerCreate(ctx, config, hostConfig, nil, nil, name)
		if err == nil {
			return docker.start(ctx, name, created.ID)
		}
		if cerrdefs.IsNotFound(err) && !pulled {
			// The daemon lost the image since the image step, or nobody
			// prepared it: pull it and create again.
			pulled = true
			if err := docker.PrepareImage(ctx, nodeproto.PrepareImageCommand{Image: config.Image, RegistryAuth: command.RegistryAuth}); err != nil {
				return err
			}
			continue
		}
		if !cerrdefs.IsConflict(err) {
			return daemonError(err, "create container %s", name)
		}
		existing, err := docker.api.ContainerInspect(ctx, name)
		if cerrdefs.IsNotFound(err) && !recreated {
			recreated = true
			continue
		}
		if err != nil {
			return daemonError(err, "inspect container %s, whose name is taken", name)
		}
		if !docker.owns(existing, command.WorkloadKey) {
			return failure.Conflict("container name %s is taken by a container that is not run %q attempt %d on this node (labels %v)",
				name, command.RunID, command.Attempt, containerLabels(existing))
		}
		if existing.State == nil || existing.State.Status != container.StateCreated {
			return nil
		}
		return docker.start(ctx, name, existing.ID)
	}
}

// missingExecutable recognises runc's words for a program that is not in
// the image ("exec: "/nope": stat /nope: no such file or directory", or
// "executable file not found in $PATH") or cannot be executed.
var missingExecutable = regexp.MustCompile(`exec: "([^"]*)": (?:stat [^:]*: )?(no such file or directory|executable file not found in \$PATH|permission denied)`)

func (docker *Runtime) start(ctx context.Context, name, id string) error {
	err := docker.api.ContainerStart(ctx, id, container.StartOptions{})
	if err == nil {
		return nil
	}
	if m := missingExecutable.FindStringSubmatch(err.Error()); m != nil {
		what := "not found in image"
		if m[2] == "permission denied" {
			what = "is not executable in image"
		}
		return &runtimeError{kind: failure.ErrInvalid, cause: err,
			message: fmt.Sprintf("start container %s: executable %q %s (daemon: %v)", name, m[1], what, err)}
	}
	return daemonError(err, "start container %s", name)
}

// StopWorkload stops one attempt: SIGTERM, then after the grace period
// (rounded up to whole seconds, which is the daemon's resolution; 10s when
// the command states none) SIGKILL, and returns once the container is no
// longer running. It is idempotent: a container that is gone or already
// stopped is success, so a redelivered stop is harmless.
//
// A container under the attempt's name that is not this attempt on this node
// (by its labels) is refused with failure.ErrConflict and left alone.
// Reason is not the runtime's business; the agent remembers it.
func (docker *Runtime) StopWorkload(ctx context.Context, command nodeproto.StopWorkloadCommand) error {
	name := ContainerName(command.WorkloadKey)
	info, err := docker.api.ContainerInspect(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return daemonError(err, "inspect container %s", name)
	}
	if !docker.owns(info, command.WorkloadKey) {
		return failure.Conflict("container %s is not run %q attempt %d on this node (labels %v); not stopping it",
			name, command.RunID, command.Attempt, containerLabels(info))
	}
	if !isRunning(info) {
		return nil
	}
	grace := command.GracePeriod
	if grace <= 0 {
		grace = defaultStopGrace
	}
	seconds := int(math.Ceil(grace.Seconds()))
	stopErr := docker.api.ContainerStop(ctx, info.ID, container.StopOptions{Timeout: &seconds})
	if cerrdefs.IsNotFound(stopErr) {
		return nil
	}
	// The daemon kills after the timeout itself; this check is for a stop
	// that failed or returned with the process still there.
	after, err := docker.api.ContainerInspect(ctx, info.ID)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return daemonError(err, "inspect container %s after stopping it", name)
	}
	if !isRunning(after) {
		return nil
	}
	killErr := docker.api.ContainerKill(ctx, info.ID, "KILL")
	if killErr == nil || cerrdefs.IsNotFound(killErr) || isNotRunning(killErr) {
		return nil
	}
	if stopErr != nil {
		return daemonError(killErr, "stop container %s (%v), then kill it", name, stopErr)
	}
	return daemonError(killErr, "kill container %s after its grace period", name)
}

func isRunning(info container.InspectResponse) bool {
	return info.ContainerJSONBase != nil && info.State != nil &&
		(info.State.Running || info.State.Paused || info.State.Restarting)
}

// isNotRunning recognises the daemon's refusal to kill a container that has
// already stopped, which for a stop is the outcome wanted.
func isNotRunning(err error) bool {
	return cerrdefs.IsConflict(err) && strings.Contains(err.Error(), "is not running")
}

// owns reports whether a container carries this attempt's labels and this
// runtime's node label.
func (docker *Runtime) owns(info container.InspectResponse, key nodeproto.WorkloadKey) bool {
	labels := containerLabels(info)
	if labels == nil {
		return false
	}
	return labels[dockerengine.LabelRun] == key.RunID && labels[dockerengine.LabelAttempt] == strconv.Itoa(key.Attempt) &&
		labels[dockerengine.LabelNode] == docker.nodeID
}

func containerLabels(info container.InspectResponse) map[string]string {
	if info.Config == nil {
		return nil
	}
	return info.Config.Labels
}
