package fnagent

import (
	"context"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/fnagent/internal/fdksocket"
	"github.com/mercator/mercator/fnagent/outputrelay"
)

// TestOutputRelay: with an output relay, a container runs the image's own
// command through it, and what the function writes reaches the engine
// through the pipes: each call's log as through the attach stream (framed
// by the FDK, or unframed), and the end of the output of a container that
// exits at once in the error that says so.
func TestOutputRelay(t *testing.T) {
	t.Parallel()
	relay := outputRelay(t)
	te := newTestEngine(t, func(c *Config) { c.OutputRelay = relay })
	r1 := te.callsLogged(fnConfig(t, "relay-fdk", fdkImage))
	info, err := te.cli.ContainerInspect(context.Background(), r1.report.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	if ep := info.Config.Entrypoint; len(ep) < 5 || ep[0] != outputrelay.InContainer || ep[1] != outputrelay.Arg || ep[3] != "--" {
		t.Fatalf("entrypoint %q; want the relay running the image's command", ep)
	}
	if c := te.hot(r1.report.ContainerID); c == nil || c.pipes.Carried() == 0 {
		t.Fatal("no output came through the relay's pipes")
	}

	raw := fnConfig(t, "relay-raw", rawImage)
	r3 := te.mustCall(raw, "log:unframed", "")
	eventually(t, 30*time.Second, "unframed logs arrive", func() bool {
		l, _ := te.Logs(r3.report.CallID)
		return string(l.Data) == "unframed\n"
	})

	exits := fnConfig(t, "relay-exit", rawImage)
	exits.Config = map[string]string{"FN_TEST_INIT": "exit"}
	if r := te.call(exits, "echo", ""); !errors.Is(r.err, ErrInitFailed) || !strings.Contains(r.err.Error(), "exiting at once") {
		t.Fatalf("err = %v; want %s with the container's last output", r.err, ErrInitFailed.Kind)
	}

	// Under 32 MiB the relay's own start would crowd the function: the
	// image's command runs as is, its output through the attach stream.
	small := fnConfig(t, "relay-small", rawImage)
	small.MemoryMB = 16
	r4 := te.mustCall(small, "log:direct", "")
	eventually(t, 30*time.Second, "a small function's logs arrive", func() bool {
		l, _ := te.Logs(r4.report.CallID)
		return string(l.Data) == "direct\n"
	})
	info, err = te.cli.ContainerInspect(context.Background(), r4.report.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Config.Entrypoint) > 0 && info.Config.Entrypoint[0] == outputrelay.InContainer {
		t.Fatalf("a 16 MiB function's entrypoint %q is the relay", info.Config.Entrypoint)
	}
}

// TestOutputRelayRefused: an engine is not made with a relay that cannot
// run in a container.
func TestOutputRelayRefused(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/bin/sh", exe + ".missing"} {
		_, err := New(Config{SocketRoot: t.TempDir(), OutputRelay: path, Tracker: NewResourceTracker(Capacity{MemoryBytes: 1 << 30, MilliCPUs: 1000})})
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("OutputRelay %s: %v; want a refusal naming it", path, err)
		}
	}
}

// TestOutputRelayTheDaemonCannotMount: a daemon that cannot find the
// relay's path (it is on another machine, or the agent in a container of
// its own) turns the relay off: the container is created without it, and
// so is every later one, with the daemon asked once.
func TestOutputRelayTheDaemonCannotMount(t *testing.T) {
	// The image is also found missing at the create without the relay,
	// so the create after its pull must not bring the relay back.
	f := &fakeDocker{present: true, command: []string{"/fn"}, refuseMount: outputRelay(t), createsMissing: 1}
	e, p := relayEngine(t, f)
	if !e.OutputRelayed() {
		t.Fatal("an engine with a relay says it relays nothing before any container")
	}
	for range 2 {
		createAndDestroy(t, e, p)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	want := [][]string{outputrelay.Entrypoint(fdksocket.DirInContainer, []string{"/fn"}), nil, nil, nil}
	if !reflect.DeepEqual(f.entrypoints, want) {
		t.Fatalf("the creates' entrypoints %q; want the relay refused once, then the image's own", f.entrypoints)
	}
	if e.OutputRelayed() {
		t.Fatal("the relay is still on")
	}
}

// TestOutputRelayWithoutPipes: pipes that cannot be made (a socket root
// on a filesystem without them) leave the container to the daemon's
// streams rather than failing its launch.
func TestOutputRelayWithoutPipes(t *testing.T) {
	f := &fakeDocker{present: true, command: []string{"/fn"}}
	e, p := relayEngine(t, f)
	e.makePipes = func(string) (*outputrelay.Pipes, error) { return nil, errors.New("mkfifo: operation not permitted") }
	createAndDestroy(t, e, p)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !reflect.DeepEqual(f.entrypoints, [][]string{nil}) {
		t.Fatalf("the create's entrypoint %q; want the image's own", f.entrypoints)
	}
	if e.relayRefused.Load() {
		t.Fatal("one container's pipes turned the relay off for all")
	}
}

// relayEngine is an engine on the fake daemon f with the output relay set
// (f.refuseMount may name it), and a pool of a 64 MiB function.
func relayEngine(t *testing.T, f *fakeDocker) (*Engine, *pool) {
	t.Helper()
	e, err := newEngine(f, Config{SocketRoot: t.TempDir(), OutputRelay: outputRelay(t), NetnsPool: -1, MaxSpares: -1,
		Tracker: NewResourceTracker(Capacity{MemoryBytes: 1 << 30, MilliCPUs: 1000})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e, e.poolLocked(FunctionConfig{ID: "f", Image: "127.0.0.1:1/fn@" + testDigest, MemoryMB: 64}, "k")
}

// createAndDestroy creates a container of p and removes it.
func createAndDestroy(t *testing.T, e *Engine, p *pool) {
	t.Helper()
	c, cerr := e.create(p, nil, ownNamespace)
	if cerr != nil {
		t.Fatalf("create: %v", cerr)
	}
	e.destroy(c, "test")
}

// hot is the engine's container of that ID, nil if none.
func (te *testEngine) hot(id string) *hotContainer {
	te.mu.Lock()
	defer te.mu.Unlock()
	for c := range te.Engine.containers {
		if c.id == id {
			return c
		}
	}
	return nil
}
