package dockerruntime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"

	"github.com/mercator/mercator/artifactcache"
	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/hostfacts"
	"github.com/mercator/mercator/nodeproto"
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
// labels dockerengine names, so an agent that restarted sees exactly what one that did
// not would.
type Runtime struct {
	api dockerengine.API

	nodeID          string
	acceleratorTool string
	kernelReports   string
	artifactRoot    string
	// kernelLog, gpus, usage and gpuOnce: the GPU health sampler and the
	// per-workload usage tracker (gpus.go).
	kernelLog string
	dcgmi     string // the GPU diagnostic's tool; "" runs none (gpus.go)
	gpus      *hostfacts.GPUSampler
	usage     *hostfacts.UsageTracker
	gpuOnce   sync.Once
	// cgroupRoot is where the cgroup filesystem is mounted. It is not an
	// option because nothing but a test needs to move it.
	cgroupRoot string

	// pulls shares one pull among concurrent PrepareImage calls of one
	// reference, abandoned when every caller waiting on it has left.
	pulls dockerengine.Pulls

	// artifactOpts configures artifacts, which keeps the Artifact copies
	// under artifactRoot; it is made once the options are read.
	artifactOpts artifactcache.Options
	artifacts    *artifactcache.Cache
	// contain is what every Run container is held to (WithContainment).
	contain dockerengine.Containment
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
// the runtime sees every container that carries dockerengine.LabelRun.
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
// Without it Facts asks hostfacts.DefaultAcceleratorTool on PATH; see
// hostfacts.Accelerators for what it asks and what each
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

// WithContainment holds every Run container this runtime creates to c
// (see dockerengine.Containment; the caller has checked it with
// Containment.Check). Without it a runtime applies
// dockerengine.DefaultContainment.
func WithContainment(c dockerengine.Containment) Option {
	return func(docker *Runtime) { docker.contain = c }
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
		contain:    dockerengine.DefaultContainment(),
	}
	for _, option := range options {
		option(docker)
	}
	docker.artifacts = artifactcache.New(docker.artifactRoot, docker.artifactOpts, docker.artifactsInUse)
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
func ContainerName(key nodeproto.WorkloadKey) string {
	run, safe := dockerengine.SafeName(key.RunID, 0)
	if !safe {
		sum := sha256.Sum256([]byte(key.RunID))
		run += "-" + hex.EncodeToString(sum[:4])
	}
	return "mercator-" + run + "-" + strconv.Itoa(key.Attempt)
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
