package netnsholder

import (
	"bytes"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"github.com/mercator/mercator/dockerengine"
)

// dockerClient fails the test, never skips it, when no daemon answers.
func dockerClient(t *testing.T) *client.Client {
	t.Helper()
	cli, err := dockerengine.NewClient("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := dockerengine.Negotiate(ctx, cli); err != nil {
		t.Fatalf("these tests need a running Docker daemon (scripts/ensure-docker.sh starts one): %v", err)
	}
	return cli
}

// TestHolderRunsInDocker: the image Ensure imports runs as a container on
// the default bridge, held as the engine holds it, and stays up blocked in
// its system call (the engine removes it by force: as PID 1 with no
// handler it ignores SIGTERM); a container joining its namespace sees the same
// network namespace. A second Ensure reuses the image.
func TestHolderRunsInDocker(t *testing.T) {
	cli := dockerClient(t)
	ctx := context.Background()
	ref, err := Ensure(ctx, cli, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	before, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := Ensure(ctx, cli, runtime.GOARCH); err != nil || again != ref {
		t.Fatalf("second Ensure = %q, %v; want %q", again, err, ref)
	}
	if after, _ := cli.ImageInspect(ctx, ref); after.ID != before.ID {
		t.Errorf("second Ensure made image %s; want %s reused", after.ID, before.ID)
	}
	if before.Config == nil || strings.Join(before.Config.Entrypoint, " ") != "/hold" {
		t.Errorf("image config %+v; want the entry point /hold", before.Config)
	}

	config, host := ContainerConfig(ref, "", dockerengine.DefaultContainment(), map[string]string{"mercator.test": t.Name()})
	holder := run(t, cli, config, host)
	info, err := cli.ContainerInspect(ctx, holder)
	if err != nil || !info.State.Running {
		t.Fatalf("holder not running: %+v, %v", info.State, err)
	}
	// The kernel says which system call a blocked process is in.
	want := map[string]string{"amd64": "34 ", "arm64": "73 "}[runtime.GOARCH]
	syscallFile := "/proc/" + strconv.Itoa(info.State.Pid) + "/syscall"
	var in []byte
	for range 100 { // it reaches its call within microseconds of starting
		if in, err = os.ReadFile(syscallFile); err == nil && strings.HasPrefix(string(in), want) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.HasPrefix(string(in), want) {
		t.Fatalf("%s: %q (%v); want the process blocked in system call %s", syscallFile, in, err, want)
	}

	// A container joining it shares its network namespace.
	joiner := run(t, cli, &container.Config{Image: ref, Labels: map[string]string{"mercator.test": t.Name()}},
		&container.HostConfig{NetworkMode: NetworkMode(holder)})
	ji, err := cli.ContainerInspect(ctx, joiner)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := netns(t, info.State.Pid), netns(t, ji.State.Pid); a != b {
		t.Errorf("holder's namespace %s, joiner's %s; want the same", a, b)
	}
}

// TestRemoveStale: an earlier program's tag goes; the current stays.
func TestRemoveStale(t *testing.T) {
	cli := dockerClient(t)
	ctx := context.Background()
	ref, err := Ensure(ctx, cli, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	stale := Repository + ":000000000000"
	program, _ := Program(runtime.GOARCH)
	if err := dockerengine.Import(ctx, cli, bytes.NewReader(Rootfs(program)), stale, nil); err != nil {
		t.Fatal(err)
	}
	removeStale(ctx, cli, ref)
	if _, err := cli.ImageInspect(ctx, stale); !cerrdefs.IsNotFound(err) {
		t.Errorf("stale tag: %v; want it gone", err)
		_, _ = cli.ImageRemove(ctx, stale, image.RemoveOptions{})
	}
	if _, err := cli.ImageInspect(ctx, ref); err != nil {
		t.Errorf("current tag: %v; want it kept", err)
	}
}

// run creates and starts a container, removed by force when the test ends.
func run(t *testing.T, cli *client.Client, config *container.Config, host *container.HostConfig) string {
	t.Helper()
	ctx := context.Background()
	created, err := cli.ContainerCreate(ctx, config, host, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cli.ContainerRemove(context.Background(), created.ID, container.RemoveOptions{Force: true}); err != nil {
			t.Errorf("remove %s: %v", created.ID, err)
		}
	})
	if err := cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	return created.ID
}

// netns is the network namespace of process pid, as the kernel names it.
func netns(t *testing.T, pid int) string {
	t.Helper()
	ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}
