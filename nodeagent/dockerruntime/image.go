package dockerruntime

import (
	"context"
	"errors"
	"fmt"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

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
func (docker *Runtime) PrepareImage(ctx context.Context, command nodeproto.PrepareImageCommand) error {
	return docker.PrepareImageProgress(ctx, command, nil)
}

// PrepareImageProgress is PrepareImage telling report, when not nil, the
// bytes its pull has downloaded (nodeagent.ImageProgress). A caller that
// joins a pull another started is not told: the pull reports to the
// caller that started it.
func (docker *Runtime) PrepareImageProgress(ctx context.Context, command nodeproto.PrepareImageCommand, report func(done, total int64)) error {
	if report != nil {
		ctx = dockerengine.WithPullProgress(ctx, report)
	}
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
