package fnagent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	dockerspec "github.com/moby/docker-image-spec/specs-go/v1"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/mercator/mercator/dockerengine"
)

// fakeDocker is a daemon that fails on purpose, for the error paths a real
// one will not take on demand. Methods it does not define panic (the nil
// embedded interface), so a test notices a call it did not expect.
type fakeDocker struct {
	dockerengine.API
	present    bool
	pullStream string
	createErr  error
	startErr   error
	// createGate, when set, holds every create until it is closed.
	createGate chan struct{}
	// command is the image's; refuseMount, when set, is a bind source
	// the daemon cannot find (on another machine).
	command     []string
	refuseMount string

	mu          sync.Mutex
	removed     []string
	entrypoints [][]string // of each create
	peers       []net.Conn
	// inspects counts ImageInspect calls; createsMissing is how many
	// creates fail for a missing image first.
	inspects, createsMissing int
}

func (f *fakeDocker) ImageInspect(context.Context, string, ...client.ImageInspectOption) (image.InspectResponse, error) {
	f.mu.Lock()
	f.inspects++
	f.mu.Unlock()
	if f.present {
		return image.InspectResponse{Config: &dockerspec.DockerOCIImageConfig{ImageConfig: ocispec.ImageConfig{Cmd: f.command}}}, nil
	}
	return image.InspectResponse{}, cerrdefs.ErrNotFound
}

func (f *fakeDocker) ImagePull(context.Context, string, image.PullOptions) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader(f.pullStream)), nil
}

func (f *fakeDocker) ContainerCreate(_ context.Context, config *container.Config, host *container.HostConfig, _ *network.NetworkingConfig, _ *ocispec.Platform, _ string) (container.CreateResponse, error) {
	f.mu.Lock()
	f.entrypoints = append(f.entrypoints, config.Entrypoint)
	f.mu.Unlock()
	for _, m := range host.Mounts {
		if f.refuseMount != "" && m.Source == f.refuseMount {
			return container.CreateResponse{}, fmt.Errorf("Error response from daemon: invalid mount config for type \"bind\": bind source path does not exist: %s", m.Source)
		}
	}
	if f.createGate != nil {
		<-f.createGate
	}
	if f.createErr != nil {
		return container.CreateResponse{}, f.createErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.createsMissing > 0 {
		f.createsMissing--
		return container.CreateResponse{}, cerrdefs.ErrNotFound
	}
	return container.CreateResponse{ID: "fake-container"}, nil
}

func (f *fakeDocker) ContainerAttach(context.Context, string, container.AttachOptions) (types.HijackedResponse, error) {
	ours, theirs := net.Pipe()
	f.mu.Lock()
	f.peers = append(f.peers, theirs)
	f.mu.Unlock()
	return types.HijackedResponse{Conn: ours, Reader: bufio.NewReader(ours)}, nil
}

func (f *fakeDocker) ContainerStart(context.Context, string, container.StartOptions) error {
	return f.startErr
}

func (f *fakeDocker) ContainerRemove(_ context.Context, id string, _ container.RemoveOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, id)
	for _, p := range f.peers {
		p.Close()
	}
	return nil
}

func (f *fakeDocker) Close() error { return nil }

func TestLaunchErrorPathsWithAFakeDaemon(t *testing.T) {
	cases := []struct {
		name        string
		fake        *fakeDocker
		want        *CallError
		wantRemoved bool
	}{
		{"the pull stream reports a refusal", &fakeDocker{pullStream: `{"status":"Pulling"}` + "\n" + `{"errorDetail":{"message":"manifest unknown"},"error":"manifest unknown"}`}, ErrImagePull, false},
		{"create fails", &fakeDocker{present: true, createErr: errors.New("no space left on device")}, ErrInitFailed, false},
		{"start fails", &fakeDocker{present: true, startErr: errors.New(`exec: "/fn": stat /fn: no such file or directory`)}, ErrInitFailed, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tracker := NewResourceTracker(Capacity{MemoryBytes: 1 << 30, MilliCPUs: 1000})
			counts := &Counters{}
			e, err := newEngine(c.fake, Config{SocketRoot: t.TempDir(), Tracker: tracker, Metrics: counts, NetnsPool: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close(context.Background())
			fn := FunctionConfig{ID: "f", Image: "127.0.0.1:1/fn@" + testDigest}
			for _, mode := range []Mode{Wait, NoWait} {
				_, err := e.Call(context.Background(), fn, CallRequest{ID: "c", Mode: mode}, httptest.NewRecorder())
				if !errors.Is(err, c.want) {
					t.Fatalf("mode %d: err = %v; want %s", mode, err, c.want.Kind)
				}
			}
			if free := tracker.Free(); free.MemoryBytes != 1<<30 {
				t.Errorf("reservation not released: %v free", free)
			}
			if c.wantRemoved != (len(c.fake.removed) > 0) {
				t.Errorf("removed %v", c.fake.removed)
			}
			if s := e.Stats(); len(s) != 0 {
				t.Errorf("stats %+v; want the pool gone", s)
			}
			if snap := counts.Snapshot(); len(snap.Containers) != 0 || snap.Errors[c.want.Kind] != 2 {
				t.Errorf("counters %+v", snap)
			}
		})
	}
}

// TestImageRemembered: a launch asks the daemon about an image once and
// remembers it present; when a create then finds it gone (removed behind
// the engine's back) the engine forgets it, asks again and creates.
func TestImageRemembered(t *testing.T) {
	f := &fakeDocker{present: true}
	e, err := newEngine(f, Config{SocketRoot: t.TempDir(), Tracker: NewResourceTracker(Capacity{MemoryBytes: 1 << 30, MilliCPUs: 1000}), MaxSpares: -1, NetnsPool: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	ctx := context.Background()
	ref := "127.0.0.1:1/fn@" + testDigest
	for range 3 {
		if _, err := e.ensureImage(ctx, ref, ""); err != nil {
			t.Fatal(err)
		}
	}
	if f.inspects != 1 {
		t.Fatalf("three checks of a present image asked the daemon %d times; want once", f.inspects)
	}
	f.createsMissing = 1
	p := e.poolLocked(FunctionConfig{ID: "f", Image: ref}, "k")
	c, cerr := e.create(p, nil, ownNamespace)
	if cerr != nil {
		t.Fatalf("create after the image went missing: %v", cerr)
	}
	if f.inspects != 2 {
		t.Errorf("after a create found the image missing: %d inspects; want the daemon asked again", f.inspects)
	}
	e.destroy(c, "test")
}

// TestAwaitPrepared: a launch that finds its pool's next container being
// prepared waits for it and takes it; a second launch meanwhile does not
// wait (a burst is not held back); with nothing being prepared none waits.
func TestAwaitPrepared(t *testing.T) {
	f := &fakeDocker{present: true, createGate: make(chan struct{})}
	e, err := newEngine(f, Config{SocketRoot: t.TempDir(), Network: "none", Tracker: NewResourceTracker(Capacity{MemoryBytes: 1 << 30, MilliCPUs: 1000})})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	p := e.poolLocked(FunctionConfig{ID: "f", Image: "127.0.0.1:1/fn@" + testDigest}, "k")
	if c := e.awaitPrepared(p, nil); c != nil {
		t.Fatalf("nothing being prepared: got %v", c)
	}
	e.mu.Lock()
	p.holdUntil = e.now().Add(time.Minute)
	e.mu.Unlock()
	e.prepare(p) // its create waits at the gate
	got := make(chan *hotContainer)
	go func() { got <- e.awaitPrepared(p, nil) }()
	eventually(t, 10*time.Second, "the first launch waiting", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return p.prepAwaited
	})
	if c := e.awaitPrepared(p, nil); c != nil {
		t.Fatalf("a second launch took %v; want it not to wait", c)
	}
	close(f.createGate)
	c := <-got
	if c == nil || c.id != "fake-container" {
		t.Fatalf("the waiting launch got %v; want the prepared container", c)
	}
	e.mu.Lock()
	left := p.prepared
	e.mu.Unlock()
	if left != nil {
		t.Errorf("the pool still lists %v as prepared", left.id)
	}
	e.destroy(c, "test")
}
