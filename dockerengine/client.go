package dockerengine

import (
	"context"
	"fmt"
	"io"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// API is the part of the Docker Engine API client Mercator uses: what the
// node agent's runtime and the function engine call, and nothing else. It is
// declared here so both depend on a couple of dozen methods rather than the
// client's hundred, and so a test can stand in a fake daemon that fails in
// exactly the way it needs (a pull whose stream reports an error halfway, a
// container that vanishes between list and inspect). *client.Client
// satisfies it.
type API interface {
	ImagePull(ctx context.Context, ref string, options image.PullOptions) (io.ReadCloser, error)
	ImageInspect(ctx context.Context, imageID string, options ...client.ImageInspectOption) (image.InspectResponse, error)
	ImageList(ctx context.Context, options image.ListOptions) ([]image.Summary, error)
	ImageImport(ctx context.Context, source image.ImportSource, ref string, options image.ImportOptions) (io.ReadCloser, error)
	ImageRemove(ctx context.Context, imageID string, options image.RemoveOptions) ([]image.DeleteResponse, error)
	ContainerCreate(ctx context.Context, config *container.Config, hostConfig *container.HostConfig, networkingConfig *network.NetworkingConfig, platform *ocispec.Platform, containerName string) (container.CreateResponse, error)
	ContainerAttach(ctx context.Context, containerID string, options container.AttachOptions) (types.HijackedResponse, error)
	ContainerStart(ctx context.Context, containerID string, options container.StartOptions) error
	ContainerInspect(ctx context.Context, containerID string) (container.InspectResponse, error)
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	ContainerStop(ctx context.Context, containerID string, options container.StopOptions) error
	ContainerKill(ctx context.Context, containerID, signal string) error
	ContainerPause(ctx context.Context, containerID string) error
	ContainerUnpause(ctx context.Context, containerID string) error
	ContainerRemove(ctx context.Context, containerID string, options container.RemoveOptions) error
	ContainerLogs(ctx context.Context, containerID string, options container.LogsOptions) (io.ReadCloser, error)
	ServerVersion(ctx context.Context) (types.Version, error)
	Events(ctx context.Context, options events.ListOptions) (<-chan events.Message, <-chan error)
	Close() error
}

var _ API = (*client.Client)(nil)

// NewClient connects to the Docker daemon at host ("unix:///…", "tcp://…"),
// or, when host is empty, where the environment says (DOCKER_HOST and
// friends, else the local socket). The API version is negotiated with the
// daemon on first use, so an older daemon (Debian's 20.10 speaks 1.41) works
// with this client. No request is made here: a daemon that is down is
// reported by the first call that needs it. The only error is a malformed
// host. The caller owns the client and Closes it.
func NewClient(host string) (*client.Client, error) {
	opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if host != "" {
		opts = append(opts, client.WithHost(host))
	}
	cli, err := client.NewClientWithOpts(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker client for %q: %w", host, err)
	}
	return cli, nil
}

// Negotiate pings the daemon and settles the Engine API version with it.
// Call it once before requests are made concurrently: the client otherwise
// negotiates lazily on its first request, and several first requests at once
// (an event stream, observations, facts) are a data race inside the client.
// The error is the client's own.
func Negotiate(ctx context.Context, cli *client.Client) error {
	ping, err := cli.Ping(ctx)
	if err != nil {
		return err
	}
	cli.NegotiateAPIVersionPing(ping)
	return nil
}
