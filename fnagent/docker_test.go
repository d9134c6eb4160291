package fnagent

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/internal/registrytest"
	"github.com/mercator/mercator/internal/testimage"
)

// The tests in engine_test.go run real containers on the local Docker
// daemon and fail, never skip, when none answers: a skipped test is a test
// CI never runs. Images are built FROM scratch from the repository's
// programs and pulled by digest from one loopback registry per test binary.

const (
	helloImage = "examples/fn-hello"
	fdkImage   = "testdata/images/fn-fdk"
	rawImage   = "testdata/images/fn-raw"
)

var registry struct {
	once    sync.Once
	host    string
	closeFn func() error
	err     error

	mu   sync.Mutex
	refs map[string]string
}

func TestMain(m *testing.M) {
	code := m.Run()
	// A cleanup that fails fails the run: the images and the registry
	// are left on a daemon others share.
	cleanupFailed := func(err error) {
		fmt.Fprintln(os.Stderr, "fnagent tests' cleanup:", err)
		code = 1
	}
	if relayBinary.dir != "" {
		if err := os.RemoveAll(relayBinary.dir); err != nil {
			cleanupFailed(err)
		}
	}
	if registry.closeFn != nil {
		if err := registry.closeFn(); err != nil {
			cleanupFailed(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	for _, ref := range registry.refs {
		if err := testimage.Untag(ctx, ref); err != nil {
			cleanupFailed(err)
		}
	}
	cancel()
	os.Exit(code)
}

// publish builds dir into an image (once per test binary), pushes it to the
// loopback registry and returns the pinned reference.
func publish(t *testing.T, dir string) string {
	t.Helper()
	dockerClient(t)
	registry.once.Do(func() {
		registry.host, registry.closeFn, registry.err = registrytest.Serve(context.Background(), "127.0.0.1:0", "")
		registry.refs = map[string]string{}
	})
	if registry.err != nil {
		t.Fatalf("registry: %v", registry.err)
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if ref, ok := registry.refs[dir]; ok {
		return ref
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ref, err := testimage.Publish(ctx, dir, registry.host)
	if err != nil {
		t.Fatalf("publish %s: %v", dir, err)
	}
	registry.refs[dir] = ref
	return ref
}

var relayBinary struct {
	once sync.Once
	dir  string
	path string
	out  []byte
	err  error
}

// outputRelay builds the mercator binary statically (once per test binary),
// the output relay an agent uses (Config.OutputRelay), and returns its path.
func outputRelay(t *testing.T) string {
	t.Helper()
	relayBinary.once.Do(func() {
		relayBinary.dir, relayBinary.err = os.MkdirTemp("", "fnagent-relay-")
		if relayBinary.err != nil {
			return
		}
		relayBinary.path = filepath.Join(relayBinary.dir, "mercator")
		cmd := exec.Command("go", "build", "-o", relayBinary.path, "github.com/mercator/mercator/cmd/mercator")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		relayBinary.out, relayBinary.err = cmd.CombinedOutput()
	})
	if relayBinary.err != nil {
		t.Fatalf("build the output relay: %v\n%s", relayBinary.err, relayBinary.out)
	}
	return relayBinary.path
}

var containerRemoveForce = container.RemoveOptions{Force: true}

// dockerClient is a client for the tests' own checks; it fails the test
// when no daemon answers.
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
		t.Fatalf("these tests need a running Docker daemon (DOCKER_HOST or the local socket; scripts/ensure-docker.sh starts one): %v", err)
	}
	return cli
}

// testEngine is an Engine with a node label of its own, so it and the
// checks see only this test's containers.
type testEngine struct {
	*Engine
	t       *testing.T
	cli     *client.Client
	node    string
	counts  *Counters
	callSeq atomic.Int64
}

// newTestEngine makes an engine with a 4 GiB, 8-core fake capacity unless
// configure says otherwise, closes it when the test ends, and checks that
// closing left none of its containers behind.
func newTestEngine(t *testing.T, configure func(*Config)) *testEngine {
	t.Helper()
	cli := dockerClient(t)
	node := fmt.Sprintf("fntest-%s-%d", strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()), time.Now().UnixNano()%1e6)
	counts := &Counters{}
	cfg := Config{
		NodeID:     node,
		Network:    "none",
		SocketRoot: t.TempDir(),
		Tracker:    NewResourceTracker(Capacity{MemoryBytes: 4 << 30, MilliCPUs: 8000}),
		Metrics:    counts,
		// Spares off unless a test asks (prepare_test.go): most tests
		// count the containers calls and holds start.
		MaxSpares: -1,
	}
	if os.Getenv("FNAGENT_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if configure != nil {
		configure(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	te := &testEngine{Engine: e, t: t, cli: cli, node: node, counts: counts}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		left := te.containers()
		for _, c := range left {
			if err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil {
				t.Errorf("removing %s: %v", c.ID, err)
			}
		}
		if len(left) > 0 {
			t.Errorf("Close left %d containers behind", len(left))
		}
		if s := counts.Snapshot(); len(s.Containers) != 0 {
			t.Errorf("container gauges after Close: %v; want all zero", s.Containers)
		}
	})
	return te
}

// containers lists this engine's containers on the daemon.
func (te *testEngine) containers() []container.Summary {
	te.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := te.cli.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", dockerengine.LabelNode+"="+te.node))})
	if err != nil {
		te.t.Fatalf("list containers: %v", err)
	}
	return list
}

// state is the daemon's status of a container: "running", "paused", …, or
// "gone".
func (te *testEngine) state(id string) string {
	te.t.Helper()
	info, err := te.cli.ContainerInspect(context.Background(), id)
	if cerrdefs.IsNotFound(err) {
		return "gone"
	}
	if err != nil {
		te.t.Fatalf("inspect %s: %v", id, err)
	}
	return info.State.Status
}

// eventually polls cond until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// result is one call's outcome.
type result struct {
	rec    *timedRecorder
	report CallReport
	err    error
	took   time.Duration
}

func (r result) body() string { return r.rec.Body.String() }

// call makes one call with body and the X-Test header test (if not empty).
func (te *testEngine) call(fn FunctionConfig, test, body string, opts ...func(*CallRequest)) result {
	te.t.Helper()
	req := CallRequest{
		ID:            fmt.Sprintf("%s-%d", te.node, te.callSeq.Add(1)),
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          strings.NewReader(body),
		ContentLength: int64(len(body)),
	}
	if test != "" {
		req.Header.Set("X-Test", test)
	}
	for _, o := range opts {
		o(&req)
	}
	rec := newTimedRecorder()
	start := time.Now()
	report, err := te.Call(context.Background(), fn, req, rec)
	return result{rec: rec, report: report, err: err, took: time.Since(start)}
}

// mustCall is call that fails the test on an error or a non-200 status.
func (te *testEngine) mustCall(fn FunctionConfig, test, body string) result {
	te.t.Helper()
	r := te.call(fn, test, body)
	if r.err != nil {
		te.t.Fatalf("call %s %q: %v", fn.ID, test, r.err)
	}
	if r.rec.Code != http.StatusOK {
		te.t.Fatalf("call %s %q: status %d, body %q", fn.ID, test, r.rec.Code, r.body())
	}
	return r
}

// timedRecorder is an httptest.ResponseRecorder that notes when and what
// the first body write was, and whether anything was written at all.
type timedRecorder struct {
	*httptest.ResponseRecorder
	mu         sync.Mutex
	firstWrite time.Time
	firstBytes []byte
	wrote      bool
}

func newTimedRecorder() *timedRecorder {
	return &timedRecorder{ResponseRecorder: httptest.NewRecorder()}
}

func (r *timedRecorder) WriteHeader(code int) {
	r.mu.Lock()
	r.wrote = true
	r.mu.Unlock()
	r.ResponseRecorder.WriteHeader(code)
}

func (r *timedRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	if r.firstWrite.IsZero() {
		r.firstWrite, r.firstBytes = time.Now(), bytes.Clone(p)
	}
	r.wrote = true
	r.mu.Unlock()
	return r.ResponseRecorder.Write(p)
}

func (r *timedRecorder) Flush() { r.ResponseRecorder.Flush() }

// fnConfig is a function of image with test-friendly limits.
func fnConfig(t *testing.T, id, image string) FunctionConfig {
	return FunctionConfig{
		ID:          id,
		AppID:       "app-" + id,
		Image:       publish(t, image),
		MemoryMB:    64,
		Timeout:     20 * time.Second,
		IdleTimeout: time.Minute,
		InitTimeout: 15 * time.Second,
	}
}
