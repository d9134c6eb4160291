package dockerruntime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/registrytest"
	"github.com/mercator/mercator/internal/testimage"
	"github.com/mercator/mercator/nodeagent/runtimetest"
	"github.com/mercator/mercator/nodeproto"
)

// The tests in this file that need Docker use the real daemon and fail,
// never skip, when none answers: a skipped test is a test CI never runs.

// dockerClient returns a client for the test's own bookkeeping (removing
// containers, checking what the runtime asked the daemon for), failing the
// test when no daemon answers.
func dockerClient(t *testing.T) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatalf("docker client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		t.Fatalf("these tests need a running Docker daemon (DOCKER_HOST or the local socket): %v", err)
	}
	return cli
}

// newTestDocker returns a Runtime on the local daemon with a node
// label no other test uses, so it sees only this test's containers, and
// removes every container carrying that label when the test ends.
func newTestDocker(t *testing.T, options ...Option) (*Runtime, string) {
	t.Helper()
	cli := dockerClient(t)
	nodeID := "test-" + strings.ReplaceAll(runtimetest.RunID(t), "/", "-")
	rt, err := New("", append([]Option{WithNodeLabel(nodeID)}, options...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		rt.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", dockerengine.LabelNode+"="+nodeID))})
		if err != nil {
			t.Errorf("cleanup: list containers: %v", err)
			return
		}
		for _, c := range list {
			if err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
				t.Errorf("cleanup: remove container %s: %v", c.ID, err)
			}
		}
	})
	return rt, nodeID
}

// publishImage builds one of the repository's test images (once per test
// process), pushes it to a registry on loopback that lives as long as the
// test, and returns its pinned reference. The daemon does not hold that
// reference until something pulls it, and the reference is removed from the
// daemon again when the test ends.
func publishImage(t *testing.T, dir string) string {
	t.Helper()
	dockerClient(t)
	host := registrytest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ref, err := testimage.Publish(ctx, dir, host)
	if err != nil {
		t.Fatalf("publish %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := testimage.Untag(context.Background(), ref); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return ref
}

func TestDockerRuntimeConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Harness {
		image := publishImage(t, testimage.Workload)
		rt, _ := newTestDocker(t)
		return runtimetest.Harness{Runtime: rt, Image: image}
	})
}

func TestDockerPrepareImagePullsByDigest(t *testing.T) {
	t.Parallel()
	image := publishImage(t, testimage.Workload)
	rt, _ := newTestDocker(t, WithArtifactRoot(t.TempDir()))
	ctx := context.Background()

	before, err := rt.Facts(ctx)
	if err != nil {
		t.Fatalf("Facts: %v", err)
	}
	if slices.Contains(before.Images, image) {
		t.Fatalf("the daemon holds %s before any pull; the test would prove nothing", image)
	}
	if err := rt.PrepareImage(ctx, nodeproto.PrepareImageCommand{Image: image, RegistryAuth: "e30="}); err != nil {
		t.Fatalf("PrepareImage(%s): %v", image, err)
	}
	after, err := rt.Facts(ctx)
	if err != nil {
		t.Fatalf("Facts: %v", err)
	}
	if !slices.Contains(after.Images, image) {
		t.Errorf("Facts.Images = %v after the pull, want it to include %s", after.Images, image)
	}
}

func TestDockerPrepareImageUnknownDigest(t *testing.T) {
	t.Parallel()
	image := publishImage(t, testimage.Workload)
	rt, _ := newTestDocker(t)
	repo, _, _ := strings.Cut(image, "@")
	missing := repo + "@sha256:" + strings.Repeat("0", 64)
	err := rt.PrepareImage(context.Background(), nodeproto.PrepareImageCommand{Image: missing})
	if err == nil {
		t.Fatalf("PrepareImage(%s) of a digest the registry lacks succeeded", missing)
	}
	if !errors.Is(err, failure.ErrNotFound) || !strings.Contains(err.Error(), missing) {
		t.Errorf("PrepareImage(%s) = %q (kind %s), want a not-found error naming the image", missing, err, failure.Code(err))
	}
	t.Logf("error as reported: %v", err)
}

func TestDockerLaunchMissingExecutable(t *testing.T) {
	t.Parallel()
	image := publishImage(t, testimage.Hello)
	rt, _ := newTestDocker(t)
	key := nodeproto.WorkloadKey{RunID: runtimetest.RunID(t), Attempt: 1}
	err := rt.LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: image, Command: []string{"/nope"}})
	want := fmt.Sprintf("start container %s: executable %q not found in image", ContainerName(key), "/nope")
	if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, failure.ErrInvalid) {
		t.Fatalf("LaunchWorkload of a missing program = %v, want an invalid error containing %q", err, want)
	}
	t.Logf("error as reported: %v", err)
	o := runtimetest.WaitForPhase(t, rt, key, nodeproto.PhaseFailed)
	if o.Error == "" || o.ExitCode != nil {
		t.Errorf("observation of a container that never started = %+v, want an Error and no exit code", o)
	}
}

func TestDockerHelloExample(t *testing.T) {
	t.Parallel()
	image := publishImage(t, testimage.Hello)
	rt, _ := newTestDocker(t)
	key := nodeproto.WorkloadKey{RunID: runtimetest.RunID(t), Attempt: 1}
	if err := rt.LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: image, Command: []string{"/hello", "mercator"}}); err != nil {
		t.Fatalf("LaunchWorkload: %v", err)
	}
	o := runtimetest.WaitForPhase(t, rt, key, nodeproto.PhaseExited)
	if o.ExitCode == nil || *o.ExitCode != 0 {
		t.Errorf("hello exited %v, want 0", derefInt(o.ExitCode))
	}
	if got := runtimetest.ReadLogs(t, rt, key, false); !strings.HasPrefix(got, "hello, mercator\nhostname: ") {
		t.Errorf("hello printed %q", got)
	}
}

func TestDockerLogs(t *testing.T) {
	t.Parallel()
	image := publishImage(t, testimage.Workload)
	rt, _ := newTestDocker(t)
	key := nodeproto.WorkloadKey{RunID: runtimetest.RunID(t), Attempt: 1}
	if err := rt.LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: image, Command: []string{"lines", "3"}}); err != nil {
		t.Fatalf("LaunchWorkload: %v", err)
	}
	runtimetest.WaitForPhase(t, rt, key, nodeproto.PhaseExited)
	// The daemon reads stdout and stderr through separate pipes, so the
	// order between the two streams is the order it read them in, not the
	// order the program wrote them; within each stream the order holds.
	for _, follow := range []bool{false, true} {
		got := runtimetest.ReadLogs(t, rt, key, follow)
		stdout := strings.Replace(got, "stderr line\n", "", 1)
		if stdout != "line 1\nline 2\nline 3\n" || len(got) != len(stdout)+len("stderr line\n") {
			t.Errorf("Logs(follow=%v) = %q, want the three stdout lines in order and the stderr line, unframed", follow, got)
		}
	}
}

func TestDockerLogsFollowRunning(t *testing.T) {
	t.Parallel()
	image := publishImage(t, testimage.Workload)
	rt, _ := newTestDocker(t)
	key := nodeproto.WorkloadKey{RunID: runtimetest.RunID(t), Attempt: 1}
	if err := rt.LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: image, Command: []string{"sleep", "120"}}); err != nil {
		t.Fatalf("LaunchWorkload: %v", err)
	}
	runtimetest.WaitForPhase(t, rt, key, nodeproto.PhaseRunning)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc, err := rt.Logs(ctx, key, true)
	if err != nil {
		t.Fatalf("Logs: %v", err)
	}
	defer rc.Close()
	buf := make([]byte, len("sleeping\n"))
	if _, err := io.ReadFull(rc, buf); err != nil || string(buf) != "sleeping\n" {
		t.Fatalf("first bytes of a followed log = %q, %v; want %q", buf, err, "sleeping\n")
	}
	if err := rt.StopWorkload(ctx, nodeproto.StopWorkloadCommand{WorkloadKey: key, GracePeriod: 10 * time.Second}); err != nil {
		t.Fatalf("StopWorkload: %v", err)
	}
	rest, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading a followed log to its end: %v", err)
	}
	if string(rest) != "received terminated\n" {
		t.Errorf("rest of the followed log = %q, want the workload's SIGTERM line and then the end", rest)
	}
}

func TestDockerNodeLabelsSeparateRuntimes(t *testing.T) {
	t.Parallel()
	image := publishImage(t, testimage.Workload)
	a, nodeA := newTestDocker(t)
	b, _ := newTestDocker(t)
	runID := runtimetest.RunID(t)
	keyA := nodeproto.WorkloadKey{RunID: runID + "-a", Attempt: 1}
	keyB := nodeproto.WorkloadKey{RunID: runID + "-b", Attempt: 1}
	if err := a.LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{WorkloadKey: keyA, Image: image, Command: []string{"echo", "a"}}); err != nil {
		t.Fatalf("launch on a: %v", err)
	}
	if err := b.LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{WorkloadKey: keyB, Image: image, Command: []string{"echo", "b"}}); err != nil {
		t.Fatalf("launch on b: %v", err)
	}
	runtimetest.WaitForPhase(t, a, keyA, nodeproto.PhaseExited)
	runtimetest.WaitForPhase(t, b, keyB, nodeproto.PhaseExited)
	for rt, want := range map[*Runtime]nodeproto.WorkloadKey{a: keyA, b: keyB} {
		observations, err := rt.Observe(context.Background())
		if err != nil {
			t.Fatalf("Observe: %v", err)
		}
		if len(observations) != 1 || observations[0].WorkloadKey != want {
			t.Errorf("runtime %s observes %+v, want only %v", rt.nodeID, observations, want)
		}
	}
	// The other node's container under this attempt's name is not b's to
	// touch.
	if err := b.StopWorkload(context.Background(), nodeproto.StopWorkloadCommand{WorkloadKey: keyA}); !errors.Is(err, failure.ErrConflict) {
		t.Errorf("b stopping a's container = %v, want failure.ErrConflict", err)
	}
	if _, err := b.Logs(context.Background(), keyA, false); !errors.Is(err, failure.ErrNotFound) {
		t.Errorf("b reading a's logs = %v, want failure.ErrNotFound", err)
	}
	err := b.LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{WorkloadKey: keyA, Image: image, Command: []string{"echo", "a"}})
	if !errors.Is(err, failure.ErrConflict) {
		t.Errorf("b launching a's attempt on the shared daemon = %v, want failure.ErrConflict", err)
	}
	_ = nodeA
}

func TestDockerLaunchAsksForTheResources(t *testing.T) {
	t.Parallel()
	image := publishImage(t, testimage.Workload)
	rt, nodeID := newTestDocker(t)
	cli := dockerClient(t)
	key := nodeproto.WorkloadKey{RunID: runtimetest.RunID(t), Attempt: 4}
	launch := nodeproto.LaunchWorkloadCommand{
		WorkloadKey: key, Image: image, Command: []string{"echo", "hi"},
		Env: map[string]string{"B": "2", "A": "1"}, CPU: 0.5, MemoryBytes: 64 << 20, Timeout: 90 * time.Second,
	}
	if err := rt.LaunchWorkload(context.Background(), launch); err != nil {
		t.Fatalf("LaunchWorkload: %v", err)
	}
	info, err := cli.ContainerInspect(context.Background(), ContainerName(key))
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	wantLabels := map[string]string{
		dockerengine.LabelRun: key.RunID, dockerengine.LabelAttempt: "4", dockerengine.LabelNode: nodeID,
		dockerengine.LabelTimeout: fmt.Sprint(int64(90 * time.Second)), dockerengine.LabelImage: image,
	}
	for k, v := range wantLabels {
		if info.Config.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, info.Config.Labels[k], v)
		}
	}
	if info.HostConfig.NanoCPUs != 5e8 || info.HostConfig.Memory != 64<<20 || info.HostConfig.MemorySwap != 64<<20 {
		t.Errorf("resources = NanoCPUs %d, Memory %d, MemorySwap %d; want 5e8 and a hard 64MiB", info.HostConfig.NanoCPUs, info.HostConfig.Memory, info.HostConfig.MemorySwap)
	}
	if info.HostConfig.AutoRemove {
		t.Error("container is auto-removed; its exit would be lost")
	}
	if !slices.Contains(info.Config.Env, "A=1") || !slices.Contains(info.Config.Env, "B=2") {
		t.Errorf("Env = %v, want A=1 and B=2", info.Config.Env)
	}
	if !slices.Equal(info.Config.Cmd, []string{"echo", "hi"}) || !slices.Equal(info.Config.Entrypoint, []string{"/workload"}) {
		t.Errorf("Cmd = %v, Entrypoint = %v; want the command as arguments to the image's entrypoint", info.Config.Cmd, info.Config.Entrypoint)
	}
}

func TestDockerFacts(t *testing.T) {
	t.Parallel()
	rt, _ := newTestDocker(t, WithArtifactRoot(filepath.Join(t.TempDir(), "not-yet-created")))
	facts, err := rt.Facts(context.Background())
	if err != nil {
		t.Fatalf("Facts: %v", err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if facts.Hostname != host || facts.OS != runtime.GOOS || facts.Arch != runtime.GOARCH {
		t.Errorf("host = %q %s/%s, want %q %s/%s", facts.Hostname, facts.OS, facts.Arch, host, runtime.GOOS, runtime.GOARCH)
	}
	if facts.CPUs <= 0 || facts.CPUs > float64(runtime.NumCPU()) {
		t.Errorf("CPUs = %v, want within (0, %d]", facts.CPUs, runtime.NumCPU())
	}
	if facts.MemoryBytes < 64<<20 || facts.MemoryBytes > 1<<50 {
		t.Errorf("MemoryBytes = %d, want a plausible machine", facts.MemoryBytes)
	}
	if facts.DiskFreeBytes <= 0 {
		t.Errorf("DiskFreeBytes = %d, want the free space of the filesystem the artifact root will be on", facts.DiskFreeBytes)
	}
	if facts.RuntimeName != "docker" || facts.RuntimeVersion == "" || facts.RuntimeAPIVersion == "" {
		t.Errorf("runtime = %q %q (API %q), want docker with its versions", facts.RuntimeName, facts.RuntimeVersion, facts.RuntimeAPIVersion)
	}
	if len(facts.Accelerators) != 0 {
		t.Errorf("Accelerators = %v; nothing queries a vendor tool yet, so none may be reported", facts.Accelerators)
	}
	for _, image := range facts.Images {
		if _, err := pinnedImage(image); err != nil {
			t.Errorf("Facts.Images holds %q, which is not a pinned reference: %v", image, err)
		}
	}
	if len(facts.Notes) != 0 {
		t.Errorf("Notes = %q, want none on a healthy machine with an artifact root", facts.Notes)
	}
}

// ---- Unit tests against a fake daemon ----

// fakeDocker is a stand-in daemon for the error paths a real one cannot be
// made to take on demand. Each call goes to the function of the same name,
// and a call the test did not expect fails with an error saying so.
type fakeDocker struct {
	imagePull        func(ctx context.Context, ref string, options image.PullOptions) (io.ReadCloser, error)
	imageInspect     func(ref string) (image.InspectResponse, error)
	imageList        func() ([]image.Summary, error)
	containerCreate  func(config *container.Config, hostConfig *container.HostConfig, name string) (container.CreateResponse, error)
	containerStart   func(id string) error
	containerInspect func(ctx context.Context, id string) (container.InspectResponse, error)
	containerList    func(options container.ListOptions) ([]container.Summary, error)
	containerStop    func(id string, options container.StopOptions) error
	containerKill    func(id, signal string) error
	containerLogs    func(id string, options container.LogsOptions) (io.ReadCloser, error)
	serverVersion    func() (types.Version, error)

	mu    sync.Mutex
	calls []string
}

var _ dockerengine.API = (*fakeDocker)(nil)

func (f *fakeDocker) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func (f *fakeDocker) count(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

func unexpected(call string) error { return fmt.Errorf("fake docker: unexpected call %s", call) }

func (f *fakeDocker) ImagePull(ctx context.Context, ref string, options image.PullOptions) (io.ReadCloser, error) {
	f.record("ImagePull " + ref)
	if f.imagePull == nil {
		return nil, unexpected("ImagePull")
	}
	return f.imagePull(ctx, ref, options)
}

func (f *fakeDocker) ImageInspect(_ context.Context, ref string, _ ...client.ImageInspectOption) (image.InspectResponse, error) {
	f.record("ImageInspect " + ref)
	if f.imageInspect == nil {
		return image.InspectResponse{}, unexpected("ImageInspect")
	}
	return f.imageInspect(ref)
}

func (f *fakeDocker) ImageList(context.Context, image.ListOptions) ([]image.Summary, error) {
	f.record("ImageList")
	if f.imageList == nil {
		return nil, unexpected("ImageList")
	}
	return f.imageList()
}

// The runtime neither imports nor removes images (the function engine's
// network namespace holder does, fnagent/netns.go).
func (f *fakeDocker) ImageImport(context.Context, image.ImportSource, string, image.ImportOptions) (io.ReadCloser, error) {
	f.record("ImageImport")
	return nil, unexpected("ImageImport")
}

func (f *fakeDocker) ImageRemove(context.Context, string, image.RemoveOptions) ([]image.DeleteResponse, error) {
	f.record("ImageRemove")
	return nil, unexpected("ImageRemove")
}

func (f *fakeDocker) ContainerCreate(_ context.Context, config *container.Config, hostConfig *container.HostConfig, _ *network.NetworkingConfig, _ *ocispec.Platform, name string) (container.CreateResponse, error) {
	f.record("ContainerCreate " + name)
	if f.containerCreate == nil {
		return container.CreateResponse{}, unexpected("ContainerCreate")
	}
	return f.containerCreate(config, hostConfig, name)
}

func (f *fakeDocker) ContainerStart(_ context.Context, id string, _ container.StartOptions) error {
	f.record("ContainerStart " + id)
	if f.containerStart == nil {
		return unexpected("ContainerStart")
	}
	return f.containerStart(id)
}

func (f *fakeDocker) ContainerInspect(ctx context.Context, id string) (container.InspectResponse, error) {
	f.record("ContainerInspect " + id)
	if f.containerInspect == nil {
		return container.InspectResponse{}, unexpected("ContainerInspect")
	}
	return f.containerInspect(ctx, id)
}

func (f *fakeDocker) ContainerList(_ context.Context, options container.ListOptions) ([]container.Summary, error) {
	f.record("ContainerList")
	if f.containerList == nil {
		return nil, unexpected("ContainerList")
	}
	return f.containerList(options)
}

func (f *fakeDocker) ContainerStop(_ context.Context, id string, options container.StopOptions) error {
	f.record("ContainerStop " + id)
	if f.containerStop == nil {
		return unexpected("ContainerStop")
	}
	return f.containerStop(id, options)
}

func (f *fakeDocker) ContainerKill(_ context.Context, id, signal string) error {
	f.record("ContainerKill " + id)
	if f.containerKill == nil {
		return unexpected("ContainerKill")
	}
	return f.containerKill(id, signal)
}

func (f *fakeDocker) ContainerLogs(_ context.Context, id string, options container.LogsOptions) (io.ReadCloser, error) {
	f.record("ContainerLogs " + id)
	if f.containerLogs == nil {
		return nil, unexpected("ContainerLogs")
	}
	return f.containerLogs(id, options)
}

func (f *fakeDocker) ServerVersion(context.Context) (types.Version, error) {
	f.record("ServerVersion")
	if f.serverVersion == nil {
		return types.Version{}, unexpected("ServerVersion")
	}
	return f.serverVersion()
}

func (f *fakeDocker) Close() error { return nil }

// The function engine's calls: the runtime never makes them.
func (f *fakeDocker) ContainerAttach(context.Context, string, container.AttachOptions) (types.HijackedResponse, error) {
	return types.HijackedResponse{}, unexpected("ContainerAttach")
}
func (f *fakeDocker) ContainerPause(context.Context, string) error {
	return unexpected("ContainerPause")
}
func (f *fakeDocker) ContainerUnpause(context.Context, string) error {
	return unexpected("ContainerUnpause")
}
func (f *fakeDocker) ContainerRemove(context.Context, string, container.RemoveOptions) error {
	return unexpected("ContainerRemove")
}

// Events never delivers: the fake's tests drive Observe directly.
func (f *fakeDocker) Events(ctx context.Context, _ events.ListOptions) (<-chan events.Message, <-chan error) {
	return nil, nil
}

// The daemon's own error shapes, as the client returns them.
func daemonNotFound(what string) error {
	return fmt.Errorf("Error response from daemon: No such %s: %w", what, cerrdefs.ErrNotFound)
}

func daemonConflict(name string) error {
	return fmt.Errorf(`Error response from daemon: Conflict. The container name "/%s" is already in use: %w`, name, cerrdefs.ErrConflict)
}

const fakeImage = "registry.test/team/job@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// fakeContainer is an inspected container with Mercator's labels.
func fakeContainer(id string, key nodeproto.WorkloadKey, nodeID, status string) container.InspectResponse {
	labels := map[string]string{dockerengine.LabelRun: key.RunID, dockerengine.LabelAttempt: fmt.Sprint(key.Attempt), dockerengine.LabelImage: fakeImage, dockerengine.LabelTimeout: "0"}
	if nodeID != "" {
		labels[dockerengine.LabelNode] = nodeID
	}
	return container.InspectResponse{
		ContainerJSONBase: &container.ContainerJSONBase{
			ID:   id,
			Name: "/" + ContainerName(key),
			State: &container.State{
				Status:     container.ContainerState(status),
				Running:    status == container.StateRunning,
				StartedAt:  "2026-01-02T03:04:05.123456789Z",
				FinishedAt: "0001-01-01T00:00:00Z",
			},
		},
		Config: &container.Config{Image: fakeImage, Labels: labels},
	}
}

func TestPinnedImage(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	for ref, ok := range map[string]bool{
		"127.0.0.1:5000/workload@" + digest:          true,
		"busybox@" + digest:                          true,
		"ghcr.io/org/team/img@" + digest:             true,
		"busybox":                                    false,
		"busybox:1.36":                               false,
		"busybox:1.36@" + digest:                     false,
		"busybox@sha256:abc":                         false,
		"busybox@sha512:" + strings.Repeat("a", 128): false,
		"":                        false,
		"library/UPPER@" + digest: false,
	} {
		got, err := pinnedImage(ref)
		if ok && (err != nil || got != ref) {
			t.Errorf("pinnedImage(%q) = %q, %v; want it accepted unchanged", ref, got, err)
		}
		if !ok && !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("pinnedImage(%q) = %q, %v; want failure.ErrInvalid", ref, got, err)
		}
	}
}

func TestContainerName(t *testing.T) {
	for _, tc := range []struct {
		key  nodeproto.WorkloadKey
		want string
	}{
		{nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}, "mercator-r1-1"},
		{nodeproto.WorkloadKey{RunID: "run_2.x-Y", Attempt: 12}, "mercator-run_2.x-Y-12"},
	} {
		if got := ContainerName(tc.key); got != tc.want {
			t.Errorf("ContainerName(%v) = %q, want %q", tc.key, got, tc.want)
		}
	}
	a := ContainerName(nodeproto.WorkloadKey{RunID: "a/b", Attempt: 1})
	b := ContainerName(nodeproto.WorkloadKey{RunID: "a b", Attempt: 1})
	if a == b || !strings.HasPrefix(a, "mercator-a-b-") {
		t.Errorf("run IDs differing only in unsafe characters got %q and %q; want distinct safe names", a, b)
	}
	if strings.ContainsAny(a+b, "/ ") {
		t.Errorf("names %q, %q hold characters Docker refuses", a, b)
	}
}

func TestDockerPullStreamErrorIsSurfaced(t *testing.T) {
	const secret = "c2VjcmV0LWNyZWRlbnRpYWw="
	fake := &fakeDocker{
		imageInspect: func(string) (image.InspectResponse, error) { return image.InspectResponse{}, daemonNotFound("image") },
		imagePull: func(_ context.Context, ref string, options image.PullOptions) (io.ReadCloser, error) {
			if options.RegistryAuth != secret {
				t.Errorf("pull sent RegistryAuth %q, want the command's", options.RegistryAuth)
			}
			// The daemon answers 200 and reports the registry's refusal
			// inside the stream.
			return io.NopCloser(strings.NewReader(`{"status":"Pulling from team/job","id":"sha256:0123"}` + "\n" +
				`{"errorDetail":{"message":"manifest for ` + ref + ` not found: manifest unknown: manifest unknown"},"error":"manifest for ` + ref + ` not found: manifest unknown: manifest unknown"}` + "\n")), nil
		},
	}
	rt := newRuntime(fake)
	err := rt.PrepareImage(context.Background(), nodeproto.PrepareImageCommand{Image: fakeImage, RegistryAuth: secret})
	if err == nil {
		t.Fatal("PrepareImage succeeded although the pull stream reported an error")
	}
	if !errors.Is(err, failure.ErrNotFound) || !strings.Contains(err.Error(), "pull image "+fakeImage) || !strings.Contains(err.Error(), "manifest unknown") {
		t.Errorf("PrepareImage = %q (kind %s), want a not-found error naming the image and the registry's reason", err, failure.Code(err))
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("the error %q carries the registry credential", err)
	}
}

func TestDockerPullRefusedByDaemon(t *testing.T) {
	fake := &fakeDocker{
		imageInspect: func(string) (image.InspectResponse, error) { return image.InspectResponse{}, daemonNotFound("image") },
		imagePull: func(context.Context, string, image.PullOptions) (io.ReadCloser, error) {
			return nil, fmt.Errorf("Error response from daemon: Get \"https://registry.test/v2/\": unauthorized: authentication required: %w", cerrdefs.ErrUnauthenticated)
		},
	}
	err := newRuntime(fake).PrepareImage(context.Background(), nodeproto.PrepareImageCommand{Image: fakeImage})
	if !errors.Is(err, failure.ErrUnauthorized) || !strings.Contains(err.Error(), fakeImage) {
		t.Errorf("PrepareImage = %v (kind %s), want an unauthorized error naming the image", err, failure.Code(err))
	}
}

func TestDockerPrepareImageAlreadyPresent(t *testing.T) {
	fake := &fakeDocker{imageInspect: func(string) (image.InspectResponse, error) { return image.InspectResponse{ID: "sha256:abc"}, nil }}
	if err := newRuntime(fake).PrepareImage(context.Background(), nodeproto.PrepareImageCommand{Image: fakeImage}); err != nil {
		t.Fatalf("PrepareImage of a held image: %v", err)
	}
	if n := fake.count("ImagePull"); n != 0 {
		t.Errorf("a held image was pulled %d times", n)
	}
}

func TestDockerConcurrentPullsCoalesce(t *testing.T) {
	var pulled atomic.Bool
	release := make(chan struct{})
	started := make(chan struct{})
	fake := &fakeDocker{
		imageInspect: func(string) (image.InspectResponse, error) {
			if pulled.Load() {
				return image.InspectResponse{ID: "sha256:abc"}, nil
			}
			return image.InspectResponse{}, daemonNotFound("image")
		},
		imagePull: func(context.Context, string, image.PullOptions) (io.ReadCloser, error) {
			close(started)
			<-release
			pulled.Store(true)
			return io.NopCloser(strings.NewReader(`{"status":"Downloaded newer image"}`)), nil
		},
	}
	rt := newRuntime(fake)
	const callers = 5
	errs := make(chan error, callers)
	go func() {
		errs <- rt.PrepareImage(context.Background(), nodeproto.PrepareImageCommand{Image: fakeImage})
	}()
	<-started
	for i := 1; i < callers; i++ {
		go func() {
			errs <- rt.PrepareImage(context.Background(), nodeproto.PrepareImageCommand{Image: fakeImage})
		}()
	}
	// Every later caller has found the image missing and joined the pull
	// once it has made its inspect.
	for fake.count("ImageInspect") < callers {
		time.Sleep(time.Millisecond)
	}
	close(release)
	for i := 0; i < callers; i++ {
		if err := <-errs; err != nil {
			t.Errorf("PrepareImage: %v", err)
		}
	}
	if n := fake.count("ImagePull"); n != 1 {
		t.Errorf("%d concurrent PrepareImage calls made %d pulls, want 1", callers, n)
	}
}

func TestDockerAbandonedPullIsCancelled(t *testing.T) {
	cancelled := make(chan struct{})
	fake := &fakeDocker{
		imageInspect: func(string) (image.InspectResponse, error) { return image.InspectResponse{}, daemonNotFound("image") },
		imagePull: func(ctx context.Context, _ string, _ image.PullOptions) (io.ReadCloser, error) {
			<-ctx.Done()
			close(cancelled)
			return nil, ctx.Err()
		},
	}
	rt := newRuntime(fake)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := rt.PrepareImage(ctx, nodeproto.PrepareImageCommand{Image: fakeImage})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("PrepareImage whose caller gave up = %v, want its context's error", err)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the pull went on after its only caller left")
	}
}

// launchFake is a daemon holding the image and refusing the create with a
// name conflict, the state a redelivered launch finds.
func launchFake(existing container.InspectResponse) *fakeDocker {
	return &fakeDocker{
		imageInspect: func(string) (image.InspectResponse, error) { return image.InspectResponse{ID: "sha256:abc"}, nil },
		containerCreate: func(_ *container.Config, _ *container.HostConfig, name string) (container.CreateResponse, error) {
			return container.CreateResponse{}, daemonConflict(name)
		},
		containerInspect: func(context.Context, string) (container.InspectResponse, error) { return existing, nil },
		containerStart:   func(string) error { return nil },
	}
}

func TestDockerLaunchAdoptsOnNameConflict(t *testing.T) {
	key := nodeproto.WorkloadKey{RunID: "r1", Attempt: 2}
	launch := nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Command: []string{"train"}}
	for _, tc := range []struct {
		name      string
		existing  container.InspectResponse
		wantStart int
		wantKind  error
	}{
		{"created is started", fakeContainer("c-created", key, "n1", container.StateCreated), 1, nil},
		{"running is left alone", fakeContainer("c-running", key, "n1", container.StateRunning), 0, nil},
		{"exited is never started again", fakeContainer("c-exited", key, "n1", container.StateExited), 0, nil},
		{"another attempt's container is refused", fakeContainer("c-other", nodeproto.WorkloadKey{RunID: "r1", Attempt: 3}, "n1", container.StateCreated), 0, failure.ErrConflict},
		{"another node's container is refused", fakeContainer("c-node", key, "n2", container.StateCreated), 0, failure.ErrConflict},
		{"an unlabelled container is refused", container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{ID: "c-foreign", State: &container.State{Status: container.StateCreated}}, Config: &container.Config{}}, 0, failure.ErrConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := launchFake(tc.existing)
			err := newRuntime(fake, WithNodeLabel("n1")).LaunchWorkload(context.Background(), launch)
			if tc.wantKind == nil && err != nil || tc.wantKind != nil && !errors.Is(err, tc.wantKind) {
				t.Fatalf("LaunchWorkload = %v, want kind %v", err, tc.wantKind)
			}
			if n := fake.count("ContainerStart " + tc.existing.ID); n != tc.wantStart {
				t.Errorf("started the existing container %d times, want %d", n, tc.wantStart)
			}
			if n := fake.count("ContainerStart"); n != tc.wantStart {
				t.Errorf("%d starts in all, want %d", n, tc.wantStart)
			}
		})
	}
}

func TestDockerLaunchStartFailureSaysWhat(t *testing.T) {
	key := nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}
	daemonSays := `Error response from daemon: failed to create shim: OCI runtime create failed: runc create failed: unable to start container process: exec: "/nope": stat /nope: no such file or directory: unknown`
	fake := &fakeDocker{
		imageInspect: func(string) (image.InspectResponse, error) { return image.InspectResponse{ID: "sha256:abc"}, nil },
		containerCreate: func(*container.Config, *container.HostConfig, string) (container.CreateResponse, error) {
			return container.CreateResponse{ID: "c1"}, nil
		},
		containerStart: func(string) error { return errors.New(daemonSays) },
	}
	err := newRuntime(fake).LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: fakeImage, Command: []string{"/nope"}})
	want := `start container mercator-r1-1: executable "/nope" not found in image`
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), daemonSays) || !errors.Is(err, failure.ErrInvalid) {
		t.Errorf("LaunchWorkload = %v, want an invalid error starting %q and keeping the daemon's words", err, want)
	}
}

func TestDockerLaunchRefusesUnpinnedImage(t *testing.T) {
	fake := &fakeDocker{}
	err := newRuntime(fake).LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{
		WorkloadKey: nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}, Image: "registry.test/team/job:latest"})
	if !errors.Is(err, failure.ErrInvalid) {
		t.Errorf("LaunchWorkload by tag = %v, want failure.ErrInvalid", err)
	}
	if len(fake.calls) != 0 {
		t.Errorf("a refused launch called the daemon: %v", fake.calls)
	}
}

// observeFake lists the given containers and inspects them by ID.
func observeFake(containers ...container.InspectResponse) *fakeDocker {
	byID := map[string]container.InspectResponse{}
	var list []container.Summary
	for _, c := range containers {
		byID[c.ID] = c
		list = append(list, container.Summary{ID: c.ID, Labels: c.Config.Labels})
	}
	return &fakeDocker{
		containerList: func(container.ListOptions) ([]container.Summary, error) { return list, nil },
		containerInspect: func(_ context.Context, id string) (container.InspectResponse, error) {
			if c, ok := byID[id]; ok {
				return c, nil
			}
			return container.InspectResponse{}, daemonNotFound("container: " + id)
		},
	}
}

func TestDockerObserveFailsOnUnreadableMoment(t *testing.T) {
	good := fakeContainer("c1", nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}, "", container.StateRunning)
	badKey := nodeproto.WorkloadKey{RunID: "r2", Attempt: 1}
	bad := fakeContainer("c2", badKey, "", container.StateRunning)
	bad.State.StartedAt = "yesterday at noon"
	observations, err := newRuntime(observeFake(good, bad)).Observe(context.Background())
	if err == nil {
		t.Fatalf("Observe = %+v, want an error: a start moment the daemon stated could not be read", observations)
	}
	if !strings.Contains(err.Error(), "yesterday at noon") || !strings.Contains(err.Error(), ContainerName(badKey)) {
		t.Errorf("Observe error %q does not say which container and what the daemon said", err)
	}
}

func TestDockerObserveSkipsVanishedContainer(t *testing.T) {
	stays := fakeContainer("c1", nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}, "", container.StateExited)
	stays.State.ExitCode = 3
	stays.State.FinishedAt = "2026-01-02T03:04:06Z"
	gone := fakeContainer("c2", nodeproto.WorkloadKey{RunID: "r2", Attempt: 1}, "", container.StateRunning)
	fake := observeFake(stays, gone)
	inspect := fake.containerInspect
	fake.containerInspect = func(ctx context.Context, id string) (container.InspectResponse, error) {
		if id == "c2" {
			return container.InspectResponse{}, daemonNotFound("container: c2")
		}
		return inspect(ctx, id)
	}
	observations, err := newRuntime(fake).Observe(context.Background())
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	if len(observations) != 1 {
		t.Fatalf("Observe = %+v, want only the container that is still there", observations)
	}
	o := observations[0]
	started := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	finished := time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)
	if o.WorkloadKey != (nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}) || o.ContainerID != "c1" || o.Phase != nodeproto.PhaseExited ||
		o.ExitCode == nil || *o.ExitCode != 3 || o.StartedAt == nil || !o.StartedAt.Equal(started) ||
		o.FinishedAt == nil || !o.FinishedAt.Equal(finished) || o.Image != fakeImage {
		t.Errorf("Observe = %+v", o)
	}
}

func TestDockerObservePhases(t *testing.T) {
	key := func(run string) nodeproto.WorkloadKey { return nodeproto.WorkloadKey{RunID: run, Attempt: 1} }
	created := fakeContainer("c-created", key("created"), "", container.StateCreated)
	created.State.StartedAt = "0001-01-01T00:00:00Z"
	failedStart := fakeContainer("c-failed", key("failed"), "", container.StateCreated)
	failedStart.State.StartedAt = "0001-01-01T00:00:00Z"
	failedStart.State.ExitCode = 127
	failedStart.State.Error = `exec: "/nope": stat /nope: no such file or directory`
	paused := fakeContainer("c-paused", key("paused"), "", container.StatePaused)
	dead := fakeContainer("c-dead", key("dead"), "", container.StateDead)
	oom := fakeContainer("c-oom", key("oom"), "", container.StateExited)
	oom.State.ExitCode, oom.State.OOMKilled, oom.State.FinishedAt = 137, true, "2026-01-02T03:05:00Z"
	oom.Config.Labels[dockerengine.LabelTimeout] = "5000000000"
	quick := fakeContainer("c-quick", key("quick"), "", container.StateExited)
	quick.State.StartedAt, quick.State.FinishedAt = "2026-01-02T03:04:05.373989192Z", "2026-01-02T03:04:05.373677346Z"
	foreign := fakeContainer("c-foreign", key("foreign"), "", container.StateRunning)
	foreign.Config.Labels[dockerengine.LabelAttempt] = "first"

	observations, err := newRuntime(observeFake(created, failedStart, paused, dead, oom, quick, foreign)).Observe(context.Background())
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	got := map[string]nodeproto.WorkloadObservation{}
	for _, o := range observations {
		got[o.RunID] = o
	}
	if len(got) != 6 {
		t.Errorf("Observe reported %d containers, want 6 (the unparseable one skipped): %+v", len(got), observations)
	}
	if o := got["created"]; o.Phase != nodeproto.PhaseCreated || o.StartedAt != nil || o.ExitCode != nil {
		t.Errorf("created = %+v", o)
	}
	if o := got["failed"]; o.Phase != nodeproto.PhaseFailed || o.Error != failedStart.State.Error || o.ExitCode != nil {
		t.Errorf("failed start = %+v", o)
	}
	if o := got["paused"]; o.Phase != nodeproto.PhaseRunning || o.FinishedAt != nil {
		t.Errorf("paused = %+v", o)
	}
	if o := got["dead"]; o.Phase != nodeproto.PhaseFailed || o.Error == "" {
		t.Errorf("dead = %+v", o)
	}
	if o := got["quick"]; o.StartedAt == nil || o.FinishedAt == nil || !o.StartedAt.Equal(*o.FinishedAt) ||
		o.FinishedAt.Format(time.RFC3339Nano) != quick.State.FinishedAt {
		t.Errorf("a container the daemon says finished before it started = %+v; want the finish moment as both (moby/moby#45445)", o)
	}
	if o := got["oom"]; o.Phase != nodeproto.PhaseExited || !o.OOMKilled || derefInt(o.ExitCode) != 137 || o.Timeout != 5*time.Second {
		t.Errorf("oom = %+v", o)
	}
}

func TestDockerObserveFailsWhenInspectFails(t *testing.T) {
	fake := observeFake(fakeContainer("c1", nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}, "", container.StateExited))
	fake.containerInspect = func(context.Context, string) (container.InspectResponse, error) {
		return container.InspectResponse{}, errors.New("Error response from daemon: i/o timeout")
	}
	if observations, err := newRuntime(fake).Observe(context.Background()); err == nil {
		t.Errorf("Observe = %+v, want an error rather than an exit with no code", observations)
	}
}

func TestDockerObserveFiltersByNode(t *testing.T) {
	for nodeID, want := range map[string]string{"n1": dockerengine.LabelNode + "=n1", "": dockerengine.LabelRun} {
		fake := &fakeDocker{containerList: func(options container.ListOptions) ([]container.Summary, error) {
			if got := options.Filters.Get("label"); !slices.Equal(got, []string{want}) || !options.All {
				t.Errorf("node %q lists with labels %v (all=%v), want [%s] and exited containers too", nodeID, got, options.All, want)
			}
			return nil, nil
		}}
		if _, err := newRuntime(fake, WithNodeLabel(nodeID)).Observe(context.Background()); err != nil {
			t.Errorf("Observe: %v", err)
		}
	}
}

func TestDockerStopIsIdempotentAndLabelBound(t *testing.T) {
	key := nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}
	missing := &fakeDocker{containerInspect: func(context.Context, string) (container.InspectResponse, error) {
		return container.InspectResponse{}, daemonNotFound("container")
	}}
	if err := newRuntime(missing).StopWorkload(context.Background(), nodeproto.StopWorkloadCommand{WorkloadKey: key}); err != nil {
		t.Errorf("StopWorkload of a missing container = %v, want nil", err)
	}

	foreign := fakeContainer("c1", key, "", container.StateRunning)
	delete(foreign.Config.Labels, dockerengine.LabelRun)
	fake := &fakeDocker{containerInspect: func(context.Context, string) (container.InspectResponse, error) { return foreign, nil }}
	if err := newRuntime(fake).StopWorkload(context.Background(), nodeproto.StopWorkloadCommand{WorkloadKey: key}); !errors.Is(err, failure.ErrConflict) {
		t.Errorf("StopWorkload of an unlabelled container = %v, want failure.ErrConflict", err)
	}
	if fake.count("ContainerStop")+fake.count("ContainerKill") != 0 {
		t.Errorf("an unlabelled container was signalled: %v", fake.calls)
	}

	running := fakeContainer("c2", key, "", container.StateRunning)
	var timeout int
	stubborn := &fakeDocker{
		containerInspect: func(context.Context, string) (container.InspectResponse, error) { return running, nil },
		containerStop: func(_ string, options container.StopOptions) error {
			timeout = *options.Timeout
			return errors.New("Error response from daemon: cannot stop container: tried to kill container, but did not receive an exit event")
		},
		containerKill: func(_, signal string) error {
			if signal != "KILL" {
				t.Errorf("kill with %s, want KILL", signal)
			}
			return nil
		},
	}
	if err := newRuntime(stubborn).StopWorkload(context.Background(), nodeproto.StopWorkloadCommand{WorkloadKey: key, GracePeriod: 2500 * time.Millisecond}); err != nil {
		t.Errorf("StopWorkload = %v, want the kill to finish the job", err)
	}
	if timeout != 3 {
		t.Errorf("stop timeout = %ds, want the 2.5s grace rounded up to 3s", timeout)
	}
	if stubborn.count("ContainerKill c2") != 1 {
		t.Errorf("calls %v, want one kill after a stop that left the container running", stubborn.calls)
	}
}

func TestDockerFactsReportWhatCannotBeMeasured(t *testing.T) {
	fake := &fakeDocker{
		serverVersion: func() (types.Version, error) {
			return types.Version{}, errors.New("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
		},
		imageList: func() ([]image.Summary, error) { return nil, errors.New("Cannot connect to the Docker daemon") },
	}
	reports := t.TempDir()
	if err := os.WriteFile(filepath.Join(reports, "meminfo"), []byte("MemTotal:       16384 kB\nMemFree: 1 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rt := newRuntime(fake, WithKernelReports(reports))
	rt.cgroupRoot = t.TempDir()
	facts, err := rt.Facts(context.Background())
	if err != nil {
		t.Fatalf("Facts: %v", err)
	}
	if facts.MemoryBytes != 16384*1024 {
		t.Errorf("MemoryBytes = %d, want MemTotal from the kernel reports", facts.MemoryBytes)
	}
	if facts.RuntimeVersion != "" || facts.Images != nil || len(facts.Notes) != 3 {
		t.Errorf("facts = %+v, want no runtime version, no images, and notes for the daemon (twice) and the missing artifact root", facts)
	}
}

func TestDockerFactsImagesAreDigests(t *testing.T) {
	fake := &fakeDocker{
		serverVersion: func() (types.Version, error) { return types.Version{Version: "20.10.24", APIVersion: "1.41"}, nil },
		imageList: func() ([]image.Summary, error) {
			return []image.Summary{
				{RepoDigests: []string{"b.test/x@sha256:" + strings.Repeat("1", 64), "a.test/x@sha256:" + strings.Repeat("2", 64)}},
				{RepoDigests: []string{"<none>@<none>"}, RepoTags: []string{"local:latest"}},
				{RepoDigests: []string{"a.test/x@sha256:" + strings.Repeat("2", 64)}},
			}, nil
		},
	}
	facts, err := newRuntime(fake).Facts(context.Background())
	if err != nil {
		t.Fatalf("Facts: %v", err)
	}
	want := []string{"a.test/x@sha256:" + strings.Repeat("2", 64), "b.test/x@sha256:" + strings.Repeat("1", 64)}
	if !slices.Equal(facts.Images, want) || facts.RuntimeVersion != "20.10.24" || facts.RuntimeAPIVersion != "1.41" {
		t.Errorf("facts = %+v, want images %v and the daemon's versions", facts, want)
	}
}

func TestDockerLogsDemultiplexes(t *testing.T) {
	key := nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}
	frame := func(stream byte, s string) string {
		n := len(s)
		return string([]byte{stream, 0, 0, 0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}) + s
	}
	fake := &fakeDocker{
		containerInspect: func(context.Context, string) (container.InspectResponse, error) {
			return fakeContainer("c1", key, "", container.StateExited), nil
		},
		containerLogs: func(id string, options container.LogsOptions) (io.ReadCloser, error) {
			if !options.ShowStdout || !options.ShowStderr || !options.Follow {
				t.Errorf("logs options %+v, want both streams, followed", options)
			}
			return io.NopCloser(strings.NewReader(frame(1, "out 1\n") + frame(2, "err 1\n") + frame(1, "out 2\n"))), nil
		},
	}
	got := runtimetest.ReadLogs(t, newRuntime(fake), key, true)
	if got != "out 1\nerr 1\nout 2\n" {
		t.Errorf("Logs = %q", got)
	}

	broken := &fakeDocker{
		containerInspect: fake.containerInspect,
		containerLogs: func(string, container.LogsOptions) (io.ReadCloser, error) {
			return io.NopCloser(io.MultiReader(strings.NewReader(frame(1, "out 1\n")), &failingReader{io.ErrUnexpectedEOF})), nil
		},
	}
	rc, err := newRuntime(broken).Logs(context.Background(), key, true)
	if err != nil {
		t.Fatalf("Logs: %v", err)
	}
	defer rc.Close()
	_, err = io.ReadAll(rc)
	if err == nil || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		t.Errorf("a log stream that broke off reads as %v; it must not look like a stream that ended", err)
	}
}

type failingReader struct{ err error }

func (r *failingReader) Read([]byte) (int, error) { return 0, r.err }

// TestDockerLogsFollowNotStarted: the daemon answers a follow of a container
// that has not started with an empty stream that ends at once, which would
// read as "exited with no output". The runtime says "not yet" instead.
func TestDockerLogsFollowNotStarted(t *testing.T) {
	key := nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}
	asked := 0
	fake := &fakeDocker{
		containerInspect: func(context.Context, string) (container.InspectResponse, error) {
			return fakeContainer("c1", key, "", container.StateCreated), nil
		},
		containerLogs: func(string, container.LogsOptions) (io.ReadCloser, error) {
			asked++
			return io.NopCloser(strings.NewReader("")), nil
		},
	}
	rt := newRuntime(fake)
	if _, err := rt.Logs(context.Background(), key, true); !errors.Is(err, failure.ErrUnavailable) {
		t.Errorf("following a container not yet started = %v, want an unavailable error", err)
	}
	if asked != 0 {
		t.Errorf("the daemon was asked for the logs %d times; a follow of a created container must not reach it", asked)
	}
	if got := runtimetest.ReadLogs(t, rt, key, false); got != "" || asked != 1 {
		t.Errorf("Logs(follow=false) of a created container = %q after %d daemon calls, want its (empty) record read once", got, asked)
	}
}

// TestObserveIgnoresFunctionContainers: function containers share the
// node label with Runs' but are not workloads; Observe never reports them
// (they carry dockerengine.LabelFn and no dockerengine.LabelRun), so the control plane never
// sees an attempt that is not one.
func TestObserveIgnoresFunctionContainers(t *testing.T) {
	run := fakeContainer("run-c", nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}, "n1", container.StateRunning)
	fn := fakeContainer("fn-c", nodeproto.WorkloadKey{}, "n1", container.StateRunning)
	fn.Config.Labels = map[string]string{dockerengine.LabelFn: "fn-1", dockerengine.LabelApp: "app-1", dockerengine.LabelNode: "n1", dockerengine.LabelPool: "p"}
	obs, err := newRuntime(observeFake(run, fn), WithNodeLabel("n1")).Observe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(obs) != 1 || obs[0].RunID != "r1" {
		t.Fatalf("observations = %+v, want the run's alone", obs)
	}
}

func derefInt(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}
