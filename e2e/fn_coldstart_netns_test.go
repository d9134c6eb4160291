package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	dockerclient "github.com/docker/docker/client"
)

// netnsStarts measures, for the cold-start benchmark, what the daemon's
// start of a function container costs with its own network namespace (on
// the daemon's default network, as function containers start) beside one
// joining the namespace of a container already running (NetworkMode
// "container:ID"): the part of the start that is the network's. Each
// container listens on a socket of its own, as a function's does, and is
// removed at once.
type netnsStarts struct {
	t      testing.TB
	cli    *dockerclient.Client
	image  string
	holder string
}

func newNetnsStarts(t testing.TB, image string) *netnsStarts {
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	n := &netnsStarts{t: t, cli: cli, image: image}
	n.holder = n.create("")
	if err := cli.ContainerStart(context.Background(), n.holder, container.StartOptions{}); err != nil {
		t.Fatalf("start the namespace's holder: %v", err)
	}
	t.Cleanup(func() {
		cli.ContainerRemove(context.Background(), n.holder, container.RemoveOptions{Force: true})
		cli.Close()
	})
	return n
}

// create makes a container of the image listening on a socket directory
// of its own, in network mode netMode ("" the default).
func (n *netnsStarts) create(netMode string) string {
	dir, err := os.MkdirTemp("", "netns-bench-")
	if err != nil {
		n.t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	n.t.Cleanup(func() { os.RemoveAll(dir) })
	created, err := n.cli.ContainerCreate(context.Background(),
		&container.Config{Image: n.image, Env: []string{"FN_FORMAT=http-stream", "FN_LISTENER=unix:" + filepath.Join("/tmp/iofs", "lsnr.sock")},
			Labels: map[string]string{"mercator.bench": "netns"}},
		&container.HostConfig{NetworkMode: container.NetworkMode(netMode), LogConfig: container.LogConfig{Type: "none"},
			Mounts: []mount.Mount{{Type: mount.TypeBind, Source: dir, Target: "/tmp/iofs"}}}, nil, nil, "")
	if err != nil {
		n.t.Fatalf("create: %v", err)
	}
	return created.ID
}

// round times one start of each kind, and removes both containers.
func (n *netnsStarts) round() (own, shared time.Duration) {
	ctx := context.Background()
	start := func(netMode string) time.Duration {
		id := n.create(netMode)
		defer n.cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true})
		began := time.Now()
		if err := n.cli.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
			n.t.Fatalf("start (network %q): %v", netMode, err)
		}
		return time.Since(began)
	}
	return start(""), start("container:" + n.holder)
}
