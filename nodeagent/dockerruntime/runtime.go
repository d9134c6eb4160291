package dockerruntime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/machine"
)

// The labels this runtime puts on every container it creates, and reads
// back (dockerengine names them all): they are how a restarted agent
// recognises its own containers with no memory of creating them.
const (
	LabelRun     = dockerengine.LabelRun
	LabelAttempt = dockerengine.LabelAttempt
	LabelNode    = dockerengine.LabelNode
	LabelTimeout = dockerengine.LabelTimeout
	LabelImage   = dockerengine.LabelImage
)

// defaultStopGrace is the grace period of a stop that states none; it is
// Docker's own default, so an operator's expectations carry over.
const defaultStopGrace = 10 * time.Second

// observeConcurrency bounds the inspects one Observe has in flight.
const observeConcurrency = 8

// Runtime executes workloads through the local Docker daemon. It is
// the first Runtime implementation, and it stays behind the narrow Runtime
// interface so containerd or another OCI runtime can replace it without the
// control-plane contract moving.
//
// The daemon is reached over its local socket by this process only. Nothing
// exposes it to the network, and the control plane never talks to it.
//
// A Runtime is safe for concurrent use. It keeps no memory of what it
// launched: everything it reports it reads back from the daemon, by the
// labels above, so an agent that restarted sees exactly what one that did
// not would.
type Runtime struct {
	api dockerengine.API

	nodeID          string
	acceleratorTool string
	kernelReports   string
	artifactRoot    string
	// cgroupRoot is where the cgroup filesystem is mounted. It is not an
	// option because nothing but a test needs to move it.
	cgroupRoot string

	// pulls shares one pull among concurrent PrepareImage calls of one
	// reference, abandoned when every caller waiting on it has left.
	pulls dockerengine.Pulls

	// artifacts holds the Artifact copies under artifactRoot (artifacts.go).
	artifacts artifactStore
	// negotiate pings the daemon and fixes the API version; nil for a
	// runtime over a fake client.
	negotiate func(ctx context.Context) error
}

// Option configures the Docker runtime.
type Option func(*Runtime)

// WithNodeLabel makes the runtime label every container it creates with
// this node's ID and see only containers so labelled: Observe lists them
// alone, and StopWorkload, Logs and a launch's adoption of an existing
// container refuse one labelled for another node.
//
// It exists because a daemon can be shared. `mercator dev` and the
// end-to-end tests run several agents against one daemon, and without it
// each would report the others' containers as its own. Without this option
// the runtime sees every container that carries LabelRun.
func WithNodeLabel(nodeID string) Option {
	return func(docker *Runtime) { docker.nodeID = nodeID }
}

// WithAcceleratorTool points this node at the vendor tool it asks about its
// own cards, by absolute path where the bare name will not resolve.
//
// It is operator configuration and not only a test seam. A unit file with a
// trimmed Environment=PATH, or a distribution that installs the tool
// somewhere the service PATH does not reach, is a machine whose agent cannot
// find nvidia-smi by name; on an 8xH100 box that is the difference between a
// fleet that runs GPU work and one that reports it has none. It is the
// second reason this exists, the first being that a test can stand in a
// machine with four A100s or no driver at all, which is the only way the
// reports this node publishes about hardware can be exercised anywhere but
// on the hardware.
//
// Without it Facts asks DefaultAcceleratorTool on PATH; see
// acceleratorProbe.read (accelerator.go) for what it asks and what each
// failure is reported as.
func WithAcceleratorTool(binary string) Option {
	return func(docker *Runtime) { docker.acceleratorTool = binary }
}

// WithKernelReports points this node at the kernel's own reports about
// itself, which is /proc everywhere but in a case that has to stand in a
// machine whose NVIDIA module is loaded or absent. Facts reads meminfo,
// self/cgroup and driver/nvidia/version under it.
func WithKernelReports(root string) Option {
	return func(docker *Runtime) { docker.kernelReports = root }
}

// WithArtifactRoot gives this node somewhere to keep immutable Artifact
// copies. It is the agent's own directory, stated by whoever started the
// agent, because only they know which filesystem has the room: a default
// under the daemon's storage would be a directory this process usually
// cannot write to, and one under a temporary directory would lose every copy
// on reboot. Facts reports the free space of the filesystem holding it;
// without it, no disk figure is reported.
func WithArtifactRoot(root string) Option {
	return func(docker *Runtime) { docker.artifactRoot = root }
}

// New connects to the Docker daemon at host ("unix:///…", "tcp://…"), or,
// when host is empty, where the environment says (dockerengine.NewClient).
// No request is made here: a daemon that is down is reported by the first
// call that needs it.
//
// The node-agent design's constructor took the path of a CLI binary and
// returned no error. Mercator drives the Engine API instead of the CLI (see
// PrepareImage for why: the registry credential), so the argument names the
// daemon, and building the client can fail on a malformed host.
func New(host string, options ...Option) (*Runtime, error) {
	cli, err := dockerengine.NewClient(host)
	if err != nil {
		return nil, failure.Invalid("docker_host", "%v", err)
	}
	return NewWithClient(cli, options...), nil
}

// NewWithClient is New over a client the caller made
// (dockerengine.NewClient), so one client can serve the runtime and the
// function engine. Close closes it.
func NewWithClient(cli *client.Client, options ...Option) *Runtime {
	docker := newRuntime(cli, options...)
	docker.negotiate = func(ctx context.Context) error {
		if err := dockerengine.Negotiate(ctx, cli); err != nil {
			return daemonError(err, "reach the Docker daemon")
		}
		return nil
	}
	return docker
}

// API is the client this runtime drives, for the composition root to share
// with the function engine.
func (docker *Runtime) API() dockerengine.API { return docker.api }

// WaitReady blocks until the daemon answers, and settles the Engine API
// version with it, retrying every second until ctx ends. The agent calls it
// once before anything else touches the daemon: the Docker client otherwise
// negotiates the version lazily on its first request, and several of its
// first requests are concurrent (the event stream, observations, facts), which
// is a data race inside the client.
func (docker *Runtime) WaitReady(ctx context.Context, log func(err error)) error {
	if docker.negotiate == nil {
		return nil
	}
	for {
		err := docker.negotiate(ctx)
		if err == nil {
			return nil
		}
		if log != nil {
			log(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func newRuntime(api dockerengine.API, options ...Option) *Runtime {
	docker := &Runtime{
		api:        api,
		cgroupRoot: "/sys/fs/cgroup",
	}
	for _, option := range options {
		option(docker)
	}
	return docker
}

// Close releases the connection to the daemon. Containers are untouched.
func (docker *Runtime) Close() error { return docker.api.Close() }

// ContainerName is the name of the container for one attempt:
// "mercator-<run>-<attempt>". A run ID holding characters Docker does not
// allow in names ([a-zA-Z0-9_.-]) has them replaced by "-" and a short hash
// of the exact ID appended, so two IDs that differ only in such characters
// still get different names. The name is what makes the daemon refuse a
// second container for the same attempt, so it must be a function of the
// attempt alone.
func ContainerName(key capability.WorkloadKey) string {
	run, safe := dockerengine.SafeName(key.RunID, 0)
	if !safe {
		sum := sha256.Sum256([]byte(key.RunID))
		run += "-" + hex.EncodeToString(sum[:4])
	}
	return "mercator-" + run + "-" + strconv.Itoa(key.Attempt)
}

// PrepareImage pulls an image by its exact manifest digest. A tag is never
// image identity, so the reference the control plane sends is already
// pinned: "repo@sha256:<64 hex>". Anything else is refused with
// failure.ErrInvalid, including a reference that carries a tag beside the
// digest: the daemon would ignore the tag, so accepting it would let a
// reference claim a name it was never checked against.
//
// It goes to the daemon's own API rather than to the CLI, for one reason:
// the credential. The CLI reads registry material out of a config file, so
// pulling a private image through it means writing the material onto the
// machine and remembering to remove it, and a pull that is killed halfway
// leaves it there. The API takes it as a header, so the material this node
// was handed exists in this process's memory for the length of one request
// and nowhere else. That is what "the machine forgets it afterwards" has to
// mean on a host an operator rents by the hour. It never appears in an
// error.
//
// An image the daemon already holds by that digest returns at once.
// Concurrent calls for one reference share one pull, made with the
// credential of the call that started it; the pull is abandoned only when
// every caller waiting on it has given up. A registry's refusal comes back
// naming the image and saying why ("manifest unknown" matches
// failure.ErrNotFound, a denied credential failure.ErrUnauthorized).
func (docker *Runtime) PrepareImage(ctx context.Context, command capability.PrepareImageCommand) error {
	ref, err := pinnedImage(command.Image)
	if err != nil {
		return err
	}
	present, err := docker.imagePresent(ctx, ref)
	if err != nil || present {
		return err
	}
	return docker.pull(ctx, ref, command.RegistryAuth)
}

// pinnedImage checks that ref names an image by manifest digest alone.
func pinnedImage(ref string) (string, error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", failure.Invalid("image", "%q is not an image reference (%v); want repo@sha256:<64 hex digits>", ref, err)
	}
	if _, tagged := named.(reference.Tagged); tagged {
		return "", failure.Invalid("image", "%q names a tag as well as a digest; send repo@sha256:<64 hex digits> alone, since the daemon ignores the tag", ref)
	}
	canonical, ok := named.(reference.Canonical)
	if !ok {
		return "", failure.Invalid("image", "%q is not pinned by a manifest digest; want repo@sha256:<64 hex digits>, because a tag can move and a node runs exactly what it was told to", ref)
	}
	if canonical.Digest().Algorithm() != "sha256" {
		return "", failure.Invalid("image", "%q is pinned by %s; want a sha256 manifest digest", ref, canonical.Digest().Algorithm())
	}
	return ref, nil
}

func (docker *Runtime) imagePresent(ctx context.Context, ref string) (bool, error) {
	_, err := docker.api.ImageInspect(ctx, ref)
	switch {
	case err == nil:
		return true, nil
	case cerrdefs.IsNotFound(err):
		return false, nil
	default:
		return false, daemonError(err, "inspect image %s", ref)
	}
}

func (docker *Runtime) pull(ctx context.Context, ref, auth string) error {
	err := docker.pulls.Do(ctx, ref, func(pullCtx context.Context) error {
		return docker.pullOnce(pullCtx, ref, auth)
	})
	if err != nil && err == ctx.Err() {
		return fmt.Errorf("pull image %s: %w", ref, err)
	}
	return err
}

// pullOnce makes one pull (dockerengine.Pull reads the daemon's progress
// stream to the end, where a registry's refusal arrives) and gives its
// failure one of Mercator's kinds.
func (docker *Runtime) pullOnce(ctx context.Context, ref, auth string) error {
	err := dockerengine.Pull(ctx, docker.api, ref, auth)
	var refused *dockerengine.RefusedError
	var broken *dockerengine.StreamError
	switch {
	case errors.As(err, &refused):
		return pullError(ref, refused.Message, refused.Cause)
	case errors.As(err, &broken):
		return &runtimeError{kind: failure.ErrUnavailable, cause: broken.Err,
			message: fmt.Sprintf("pull image %s: %v", ref, broken)}
	case err != nil:
		return fmt.Errorf("pull image %s: %w", ref, err)
	}
	// The stream ending without an error is the daemon's word that the
	// image is there; checking costs one request and turns a daemon that
	// lost the stream's tail into an error instead of a failed launch later.
	present, err := docker.imagePresent(ctx, ref)
	if err != nil {
		return err
	}
	if !present {
		return failure.Unavailable("pull image %s: the daemon reported success but does not hold the image", ref)
	}
	return nil
}

// pullError classifies a registry's or daemon's refusal of a pull by what it
// says, because the stream carries only a message.
func pullError(ref, message string, cause error) error {
	lower := strings.ToLower(message)
	kind := failure.ErrUnavailable
	switch {
	case cause != nil && (errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded)):
		kind = nil
	case cause != nil && cerrdefs.IsNotFound(cause),
		strings.Contains(lower, "manifest unknown"), strings.Contains(lower, "not found"):
		kind = failure.ErrNotFound
	case cause != nil && (cerrdefs.IsUnauthorized(cause) || cerrdefs.IsPermissionDenied(cause)),
		strings.Contains(lower, "unauthorized"), strings.Contains(lower, "denied"),
		strings.Contains(lower, "authentication required"), strings.Contains(lower, "no basic auth credentials"):
		kind = failure.ErrUnauthorized
	case cause != nil && cerrdefs.IsInvalidArgument(cause):
		kind = failure.ErrInvalid
	}
	return &runtimeError{kind: kind, cause: cause, message: fmt.Sprintf("pull image %s: %s", ref, message)}
}

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
// GPUs are limits. The image is expected to be held already (the agent's
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
func (docker *Runtime) LaunchWorkload(ctx context.Context, command capability.LaunchWorkloadCommand) error {
	config, hostConfig, err := containerConfig(command, docker.nodeID, docker.artifactPath)
	if err != nil {
		return err
	}
	release, err := docker.holdArtifacts(ctx, command.Artifacts)
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
func (docker *Runtime) create(ctx context.Context, command capability.LaunchWorkloadCommand, config *container.Config, hostConfig *container.HostConfig) error {
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
			if err := docker.PrepareImage(ctx, capability.PrepareImageCommand{Image: config.Image, RegistryAuth: command.RegistryAuth}); err != nil {
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
func (docker *Runtime) StopWorkload(ctx context.Context, command capability.StopWorkloadCommand) error {
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
func (docker *Runtime) owns(info container.InspectResponse, key capability.WorkloadKey) bool {
	labels := containerLabels(info)
	if labels == nil {
		return false
	}
	return labels[LabelRun] == key.RunID && labels[LabelAttempt] == strconv.Itoa(key.Attempt) &&
		labels[LabelNode] == docker.nodeID
}

func containerLabels(info container.InspectResponse) map[string]string {
	if info.Config == nil {
		return nil
	}
	return info.Config.Labels
}

// Observe reports every Mercator container this daemon knows about, running
// or exited, and when each of them really started. It is the node's own
// authority: the control plane learns that a process began and ended here,
// whatever the application did or did not report.
//
// The start moment is a second read, because `docker ps` does not carry it
// in any format: the daemon reports State.StartedAt only on inspect. The
// node-agent design asks for one inspect for the whole list rather than one per
// container. The Engine API has no batch inspect (the CLI's `docker inspect
// a b c` is one request per name too), so the intent is kept the way it can
// be: one list, then the inspects for all of it at once, at most eight in
// flight, so a machine with many exited attempts costs one round trip's
// latency, not one per container.
//
// What each observation says:
//
//   - Phase: "created", "running" (also paused or restarting: the process
//     exists), "exited" (also "removing": it ran and ended), or "failed" for
//     a container that was created but could not start (the daemon states
//     an error and it never ran) and for one the daemon marked "dead",
//     whose end the daemon could not complete; Error then says why.
//   - ExitCode only when exited; OOMKilled as the daemon states it.
//   - StartedAt and FinishedAt are the daemon's moments, nil where the daemon
//     states none (its zero time); FinishedAt only once the container is no
//     longer running. An exited container never has FinishedAt before
//     StartedAt: older daemons stamp the start late, and where that puts it
//     after the exit, the exit moment is reported as the start too.
//   - Timeout and Image from the container's own labels.
//
// A container that vanished between the list and its inspect is skipped:
// it is gone, and the agent reports what it last told the control plane
// about it as missing. A container whose Mercator labels do not parse was
// not made by Mercator and is skipped too.
//
// A moment the daemon does state and this runtime cannot read fails the
// whole read instead, which is the same answer the Docker adapter gives to
// the same daemon: reporting it absent would publish no start for any
// container on this machine and degrade every start-latency row on the only
// reusable lane there is, with nothing anywhere saying that is what
// happened. Any other failed inspect fails the read too, because only the
// inspect carries the exit code: the next observation asks again and loses
// nothing, while a partial one would report an exit with no code.
//
// The result is sorted by run and attempt; the caller owns it.
func (docker *Runtime) Observe(ctx context.Context) ([]capability.WorkloadObservation, error) {
	filter := filters.NewArgs()
	if docker.nodeID != "" {
		filter.Add("label", LabelNode+"="+docker.nodeID)
	} else {
		filter.Add("label", LabelRun)
	}
	list, err := docker.api.ContainerList(ctx, container.ListOptions{All: true, Filters: filter})
	if err != nil {
		return nil, daemonError(err, "list containers")
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		observation capability.WorkloadObservation
		ok          bool
		err         error
	}
	results := make([]result, len(list))
	limit := make(chan struct{}, observeConcurrency)
	var wg sync.WaitGroup
	for i, summary := range list {
		if _, ok := workloadKey(summary.Labels); !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case limit <- struct{}{}:
			case <-ctx.Done():
				results[i].err = ctx.Err()
				return
			}
			defer func() { <-limit }()
			info, err := docker.api.ContainerInspect(ctx, summary.ID)
			if cerrdefs.IsNotFound(err) {
				return
			}
			if err != nil {
				results[i].err = daemonError(err, "inspect container %s", summary.ID)
				cancel()
				return
			}
			observation, ok, err := docker.observation(info)
			if err != nil {
				cancel()
			}
			results[i] = result{observation: observation, ok: ok, err: err}
		}()
	}
	wg.Wait()

	observations := make([]capability.WorkloadObservation, 0, len(list))
	var firstErr error
	for _, r := range results {
		if r.err != nil && (firstErr == nil || errors.Is(firstErr, context.Canceled)) {
			// A sibling's cancellation is noise; the error that caused it
			// is the one worth returning.
			firstErr = r.err
		}
		if r.ok {
			observations = append(observations, r.observation)
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	sort.Slice(observations, func(i, j int) bool {
		a, b := observations[i].WorkloadKey, observations[j].WorkloadKey
		if a.RunID != b.RunID {
			return a.RunID < b.RunID
		}
		return a.Attempt < b.Attempt
	})
	return observations, nil
}

// workloadKey reads the attempt a container belongs to from its labels.
func workloadKey(labels map[string]string) (capability.WorkloadKey, bool) {
	run, ok := labels[LabelRun]
	if !ok || run == "" {
		return capability.WorkloadKey{}, false
	}
	attempt, err := strconv.Atoi(labels[LabelAttempt])
	if err != nil {
		return capability.WorkloadKey{}, false
	}
	return capability.WorkloadKey{RunID: run, Attempt: attempt}, true
}

// observation maps one inspected container. ok is false for a container
// that is not Mercator's after all (its labels do not parse, or it belongs
// to another node).
func (docker *Runtime) observation(info container.InspectResponse) (capability.WorkloadObservation, bool, error) {
	labels := containerLabels(info)
	key, ok := workloadKey(labels)
	if !ok || info.ContainerJSONBase == nil || info.State == nil || labels[LabelNode] != docker.nodeID && docker.nodeID != "" {
		return capability.WorkloadObservation{}, false, nil
	}
	var timeout time.Duration
	if raw, ok := labels[LabelTimeout]; ok {
		ns, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || ns < 0 {
			return capability.WorkloadObservation{}, false, nil
		}
		timeout = time.Duration(ns)
	}
	name := strings.TrimPrefix(info.Name, "/")
	startedAt, err := daemonTime(info.State.StartedAt)
	if err != nil {
		return capability.WorkloadObservation{}, false, fmt.Errorf("container %s: the daemon's StartedAt %q: %w", name, info.State.StartedAt, err)
	}
	finishedAt, err := daemonTime(info.State.FinishedAt)
	if err != nil {
		return capability.WorkloadObservation{}, false, fmt.Errorf("container %s: the daemon's FinishedAt %q: %w", name, info.State.FinishedAt, err)
	}
	image := labels[LabelImage]
	if image == "" && info.Config != nil {
		image = info.Config.Image
	}
	o := capability.WorkloadObservation{
		WorkloadKey: key,
		ContainerID: info.ID,
		Image:       image,
		OOMKilled:   info.State.OOMKilled,
		StartedAt:   startedAt,
		Timeout:     timeout,
	}
	state := info.State
	switch state.Status {
	case container.StateRunning, container.StatePaused, container.StateRestarting:
		o.Phase = capability.PhaseRunning
	case container.StateExited, container.StateRemoving:
		o.Phase = capability.PhaseExited
		code := state.ExitCode
		o.ExitCode = &code
		o.FinishedAt = finishedAt
		if startedAt != nil && finishedAt != nil && finishedAt.Before(*startedAt) {
			// Docker before 25 stamps StartedAt only after the start
			// call returns, so a process that exits at once can show a
			// StartedAt after its FinishedAt (moby/moby#45445, fixed by
			// moby/moby#47003). The exit moment is the accurate one and the
			// process cannot have started after it, so the daemon's own
			// FinishedAt is the tightest start moment it states.
			clamped := *finishedAt
			o.StartedAt = &clamped
		}
	case container.StateCreated:
		o.Phase = capability.PhaseCreated
		if state.Error != "" {
			// A start that failed leaves the container "created" with the
			// runtime's error; it will never run unless started again.
			o.Phase = capability.PhaseFailed
			o.Error = state.Error
			o.FinishedAt = finishedAt
		}
	case container.StateDead:
		o.Phase = capability.PhaseFailed
		o.Error = "the daemon marked the container dead"
		if state.Error != "" {
			o.Error += ": " + state.Error
		}
		o.FinishedAt = finishedAt
	default:
		o.Phase = capability.PhaseFailed
		o.Error = fmt.Sprintf("the daemon reports an unknown state %q", state.Status)
	}
	return o, true, nil
}

// daemonTime reads one of the daemon's moments. The daemon writes
// RFC 3339 with nanoseconds, and its zero time ("0001-01-01T00:00:00Z") for
// a moment that has not happened, which is reported as nil.
func daemonTime(s string) (*time.Time, error) {
	if s == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, err
	}
	if t.IsZero() {
		return nil, nil
	}
	return &t, nil
}

// Logs returns one attempt's stdout and stderr as one stream, demultiplexed
// from the daemon's framing, in the order the daemon recorded the lines. See
// LogSource for the contract. A container that is not this attempt on this
// node is failure.ErrNotFound, like a missing one: it is not this runtime's
// to read.
func (docker *Runtime) Logs(ctx context.Context, key capability.WorkloadKey, follow bool) (io.ReadCloser, error) {
	name := ContainerName(key)
	info, err := docker.api.ContainerInspect(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return nil, failure.NotFound("workload container", name)
	}
	if err != nil {
		return nil, daemonError(err, "inspect container %s", name)
	}
	if !docker.owns(info, key) {
		return nil, failure.NotFound("workload container", name)
	}
	if follow && info.State != nil && info.State.Status == "created" {
		// The daemon follows only a running container's log; asked to follow
		// one not yet started it answers with what is recorded (nothing) and
		// ends, which would read as "exited, everything delivered".
		return nil, failure.Unavailable("container %s has not started yet; its output can be followed once it runs", name)
	}
	raw, err := docker.api.ContainerLogs(ctx, info.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true, Follow: follow})
	if err != nil {
		return nil, daemonError(err, "logs of container %s", name)
	}
	if info.Config != nil && info.Config.Tty {
		// A terminal has one stream and the daemon sends it unframed.
		return raw, nil
	}
	reader, writer := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(writer, writer, raw)
		raw.Close()
		if err != nil {
			// Not wrapped: a stream that broke must not read as one that
			// ended (io.EOF, io.ErrUnexpectedEOF) to a caller deciding
			// whether it has everything.
			err = fmt.Errorf("logs of container %s broke off: %v", name, err)
		}
		writer.CloseWithError(err)
	}()
	return &logStream{PipeReader: reader, raw: raw}, nil
}

// logStream closes both ends, so a reader that stops early also ends the
// daemon's request and the goroutine copying it.
type logStream struct {
	*io.PipeReader
	raw io.Closer
}

func (s *logStream) Close() error {
	s.PipeReader.Close()
	return s.raw.Close()
}

// PrepareArtifact replicates one immutable version onto this machine,
// through the location the control plane minted for this one fetch and
// nowhere else; a command without one is refused. See prepareArtifact
// (artifacts.go) for the whole contract.
func (docker *Runtime) PrepareArtifact(ctx context.Context, command capability.PrepareArtifactCommand) error {
	return docker.prepareArtifact(ctx, command)
}

// Facts reports what this machine measured about itself: host name, OS and
// architecture, CPUs, memory, the free space where Artifacts are kept, the
// Docker daemon's version, and the images it holds by digest. A limit this
// process runs under is the machine's answer: CPUs are capped by a cgroup
// CPU quota and memory by a cgroup memory limit where one applies (v1 and
// v2), because that is what a workload launched here can have.
//
// A figure that cannot be measured is left zero with a Note saying why, and
// the facts are returned anyway (a daemon that is down is itself a fact
// worth reporting); only the caller's context ending is an error.
// Accelerators are the NVIDIA GPUs the vendor tool lists, asked once per call
// and bounded by AcceleratorToolTimeout, and only when the kernel module is
// loaded and the container runtime can hand them to a container; otherwise
// none, with a Note saying why (accelerator.go). AgentVersion is the agent's
// to fill.
func (docker *Runtime) Facts(ctx context.Context) (capability.NodeFacts, error) {
	facts := capability.NodeFacts{
		OS:                runtime.GOOS,
		Arch:              runtime.GOARCH,
		RuntimeName:       "docker",
		CapabilityVersion: capability.Version,
	}
	note := func(format string, args ...any) { facts.Notes = append(facts.Notes, fmt.Sprintf(format, args...)) }

	if host, err := os.Hostname(); err == nil {
		facts.Hostname = host
	} else {
		note("hostname: %v", err)
	}

	procRoot := docker.kernelReports
	if procRoot == "" {
		procRoot = "/proc"
	}
	limits := machine.CgroupLimits(procRoot, docker.cgroupRoot)
	facts.CPUs = float64(runtime.NumCPU())
	if limits.CPUs > 0 && limits.CPUs < facts.CPUs {
		facts.CPUs = limits.CPUs
	}
	if total, err := machine.MemTotal(filepath.Join(procRoot, "meminfo")); err == nil {
		facts.MemoryBytes = total
		if limits.MemoryBytes > 0 && limits.MemoryBytes < total {
			facts.MemoryBytes = limits.MemoryBytes
		}
	} else {
		note("memory: %v", err)
	}

	accelerators, accelNotes, err := docker.readAccelerators(ctx, procRoot)
	if err != nil {
		return capability.NodeFacts{}, err
	}
	facts.Accelerators = accelerators
	facts.Notes = append(facts.Notes, accelNotes...)

	if docker.artifactRoot == "" {
		note("disk free: not measured, because no artifact root is configured")
	} else if free, err := diskFree(docker.artifactRoot); err == nil {
		facts.DiskFreeBytes = free
	} else {
		note("disk free at %s: %v", docker.artifactRoot, err)
	}

	if version, err := docker.api.ServerVersion(ctx); err == nil {
		facts.RuntimeVersion = version.Version
		facts.RuntimeAPIVersion = version.APIVersion
	} else {
		if ctx.Err() != nil {
			return capability.NodeFacts{}, ctx.Err()
		}
		note("docker daemon version: %v", err)
	}
	images, err := docker.api.ImageList(ctx, image.ListOptions{})
	if err != nil {
		if ctx.Err() != nil {
			return capability.NodeFacts{}, ctx.Err()
		}
		note("docker images: %v", err)
	}
	for _, summary := range images {
		for _, digest := range summary.RepoDigests {
			if !strings.Contains(digest, "<none>") && strings.Contains(digest, "@sha256:") {
				facts.Images = append(facts.Images, digest)
			}
		}
	}
	sort.Strings(facts.Images)
	facts.Images = slices.Compact(facts.Images)
	docker.describeArtifacts(&facts)
	return facts, nil
}

// diskFree is the space an unprivileged writer can use on the filesystem
// holding path, or, while path does not exist yet, its nearest existing
// ancestor: the root is created on the first Artifact, and the filesystem it
// will land on is the answer until then.
func diskFree(path string) (int64, error) {
	for {
		var st syscall.Statfs_t
		err := syscall.Statfs(path, &st)
		if err == nil {
			return int64(st.Bavail) * int64(st.Bsize), nil
		}
		parent := filepath.Dir(path)
		if !errors.Is(err, syscall.ENOENT) || parent == path {
			return 0, err
		}
		path = parent
	}
}

// runtimeError is an error of one of Mercator's kinds that keeps the
// daemon's own error underneath, so errors.Is matches both the kind
// (failure.ErrNotFound) and the daemon's classification or a context's end.
type runtimeError struct {
	kind    error
	cause   error
	message string
}

func (e *runtimeError) Error() string { return e.message }

func (e *runtimeError) Unwrap() []error {
	var errs []error
	if e.kind != nil {
		errs = append(errs, e.kind)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

// daemonError describes a failed daemon call in Mercator's words, keeping
// the daemon's message, and gives it the failure kind the daemon's answer
// implies. A failure the daemon does not classify (a runtime error inside
// it) gets no kind: it is internal, not a reason to retry.
func daemonError(err error, format string, args ...any) error {
	var kind error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
	case cerrdefs.IsNotFound(err):
		kind = failure.ErrNotFound
	case cerrdefs.IsConflict(err):
		kind = failure.ErrConflict
	case cerrdefs.IsInvalidArgument(err):
		kind = failure.ErrInvalid
	case cerrdefs.IsUnauthorized(err), cerrdefs.IsPermissionDenied(err):
		kind = failure.ErrUnauthorized
	case client.IsErrConnectionFailed(err), cerrdefs.IsUnavailable(err):
		kind = failure.ErrUnavailable
	}
	return &runtimeError{kind: kind, cause: err, message: fmt.Sprintf(format, args...) + ": " + err.Error()}
}
