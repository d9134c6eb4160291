package fnagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Labels on every function container. LabelFn is what tells the node agent
// a container is a function's and not a Run's (Runs carry mercator.run);
// LabelNode has the same name and meaning as the node agent's.
const (
	LabelFn   = "mercator.fn"
	LabelApp  = "mercator.app"
	LabelPool = "mercator.fn.pool"
	LabelNode = "mercator.node"
)

// dockerAPI is the part of the Docker Engine API client the engine uses,
// declared here so the engine depends on a dozen methods and a test can
// stand in a daemon that fails on purpose. *client.Client satisfies it.
type dockerAPI interface {
	ImagePull(ctx context.Context, ref string, options image.PullOptions) (io.ReadCloser, error)
	ImageInspect(ctx context.Context, imageID string, options ...client.ImageInspectOption) (image.InspectResponse, error)
	ContainerCreate(ctx context.Context, config *container.Config, hostConfig *container.HostConfig, networkingConfig *network.NetworkingConfig, platform *ocispec.Platform, containerName string) (container.CreateResponse, error)
	ContainerAttach(ctx context.Context, containerID string, options container.AttachOptions) (types.HijackedResponse, error)
	ContainerStart(ctx context.Context, containerID string, options container.StartOptions) error
	ContainerInspect(ctx context.Context, containerID string) (container.InspectResponse, error)
	ContainerPause(ctx context.Context, containerID string) error
	ContainerUnpause(ctx context.Context, containerID string) error
	ContainerRemove(ctx context.Context, containerID string, options container.RemoveOptions) error
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	Close() error
}

var _ dockerAPI = (*client.Client)(nil)

// pullGroup shares one pull among the launches that need the same image.
// Pulls belong to the engine, not to a call, so none is abandoned because
// the call that started it gave up: the next call wants the image too.
type pullGroup struct {
	mu    sync.Mutex
	calls map[string]*pullCall
}

type pullCall struct {
	done chan struct{}
	err  error
}

// ensureImage makes the daemon hold ref, pulling it if needed within the
// engine's PullTimeout. Errors are KindImagePull or KindImagePullTimeout.
func (e *Engine) ensureImage(ctx context.Context, ref, auth string) error {
	if _, err := e.api.ImageInspect(ctx, ref); err == nil {
		return nil
	} else if !cerrdefs.IsNotFound(err) {
		return callErr(KindImagePull, err, "inspect image %s: %v", ref, err)
	}
	e.pulls.mu.Lock()
	if e.pulls.calls == nil {
		e.pulls.calls = map[string]*pullCall{}
	}
	call := e.pulls.calls[ref]
	if call == nil {
		call = &pullCall{done: make(chan struct{})}
		e.pulls.calls[ref] = call
		e.bg.Add(1)
		go func() {
			defer e.bg.Done()
			pullCtx, cancel := context.WithTimeout(e.ctx, e.cfg.PullTimeout)
			err := e.pullOnce(pullCtx, ref, auth)
			if err != nil && errors.Is(pullCtx.Err(), context.DeadlineExceeded) {
				err = callErr(KindImagePullTimeout, err, "pull image %s: not done within %v", ref, e.cfg.PullTimeout)
			} else if err != nil {
				err = callErr(KindImagePull, err, "pull image %s: %v", ref, err)
			}
			cancel()
			e.pulls.mu.Lock()
			delete(e.pulls.calls, ref)
			e.pulls.mu.Unlock()
			call.err = err
			close(call.done)
		}()
	}
	e.pulls.mu.Unlock()
	select {
	case <-call.done:
		return call.err
	case <-ctx.Done():
		return callErr(KindImagePull, ctx.Err(), "pull image %s: %v", ref, ctx.Err())
	}
}

// pullOnce pulls ref and reads the daemon's progress to the end: the daemon
// answers 200 before it talks to the registry, so a refusal arrives as an
// error inside the stream.
func (e *Engine) pullOnce(ctx context.Context, ref, auth string) error {
	stream, err := e.api.ImagePull(ctx, ref, image.PullOptions{RegistryAuth: auth})
	if err != nil {
		return err
	}
	defer stream.Close()
	decoder := json.NewDecoder(stream)
	for {
		var message struct {
			Error *struct {
				Message string `json:"message"`
			} `json:"errorDetail,omitempty"`
			ErrorMessage string `json:"error,omitempty"`
		}
		if err := decoder.Decode(&message); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("reading the daemon's progress: %w", err)
		}
		if message.Error != nil && message.Error.Message != "" {
			return errors.New(message.Error.Message)
		}
		if message.ErrorMessage != "" {
			return errors.New(message.ErrorMessage)
		}
	}
	if _, err := e.api.ImageInspect(ctx, ref); err != nil {
		return fmt.Errorf("the daemon reported success but does not hold the image: %w", err)
	}
	return nil
}

// containerName is "mercator-fn-<fn ID, made safe>-<random>".
func containerName(fnID, suffix string) string {
	var b strings.Builder
	for _, r := range fnID {
		if r < 0x80 && (r == '_' || r == '.' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
		if b.Len() >= 40 {
			break
		}
	}
	return "mercator-fn-" + b.String() + "-" + suffix
}

// RemoveOrphans removes function containers on this node (by LabelNode, or
// every container with LabelFn when NodeID is empty) that this engine did
// not start: those a previous agent left behind. A hot container cannot be
// adopted, since its socket directory and the calls it was serving belong
// to the process that died. The agent calls it once at startup. It returns
// how many it removed.
func (e *Engine) RemoveOrphans(ctx context.Context) (int, error) {
	args := filters.NewArgs(filters.Arg("label", LabelFn))
	if e.cfg.NodeID != "" {
		args.Add("label", LabelNode+"="+e.cfg.NodeID)
	}
	list, err := e.api.ContainerList(ctx, container.ListOptions{All: true, Filters: args})
	if err != nil {
		return 0, fmt.Errorf("list function containers: %w", err)
	}
	e.mu.Lock()
	ours := map[string]bool{}
	for c := range e.containers {
		ours[c.id] = true
	}
	e.mu.Unlock()
	removed := 0
	for _, c := range list {
		if ours[c.ID] || e.cfg.NodeID == "" && c.Labels[LabelNode] != "" {
			continue
		}
		if err := e.api.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			return removed, fmt.Errorf("remove orphaned function container %s: %w", c.ID, err)
		}
		removed++
	}
	return removed, nil
}
