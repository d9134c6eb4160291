package fnagent

import (
	"context"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/mercator/mercator/dockerengine"
)

// TestSpareJoinsHolder, on the daemon's default bridge: a spare is created
// joining the namespace of a running holder (labelled as one, never as a
// function's container, held to the containment with its own tiny
// limits), and the call after a scale to zero starts it in that namespace.
// A holder killed behind the engine's back fails no launch: a fresh
// container serves, and the dead holder goes with its spare. Forget, and
// a restarted agent's RemoveOrphans, leave no holder behind; Close is
// checked by newTestEngine.
func TestSpareJoinsHolder(t *testing.T) {
	t.Parallel()
	// No pool (netnspool_test.go): every holder here is a spare's own.
	te := newTestEngine(t, func(c *Config) { c.Network = ""; c.MaxSpares = 4; c.NetnsPool = -1 })
	fn := fnConfig(t, "netns", rawImage)
	fn.IdleTimeout = 500 * time.Millisecond
	ctx := context.Background()

	first := te.mustCall(fn, "echo", "x")
	spare, holder := te.spareAndHolder(fn.ID, "")
	h, err := te.cli.ContainerInspect(ctx, holder)
	if err != nil {
		t.Fatal(err)
	}
	if !h.State.Running || h.Config.Labels[dockerengine.LabelFn] != "" || h.Config.Labels[dockerengine.LabelNode] != te.node {
		t.Errorf("holder running %v, labels %v; want running, on the node, not a function's", h.State.Running, h.Config.Labels)
	}
	var dropped []string // the daemon names them CAP_X
	for _, c := range h.HostConfig.CapDrop {
		dropped = append(dropped, strings.TrimPrefix(c, "CAP_"))
	}
	if h.HostConfig.Memory != 6<<20 || h.HostConfig.PidsLimit == nil || *h.HostConfig.PidsLimit != 8 || !h.HostConfig.ReadonlyRootfs ||
		!reflect.DeepEqual(dropped, dockerengine.DroppedCapabilities) || !slices.Contains(h.HostConfig.SecurityOpt, dockerengine.NoNewPrivileges) {
		t.Errorf("holder's host config: memory %d, pids %v, read-only %v, dropped %v, options %v; want the containment with 6 MiB and 8 processes",
			h.HostConfig.Memory, h.HostConfig.PidsLimit, h.HostConfig.ReadonlyRootfs, dropped, h.HostConfig.SecurityOpt)
	}
	for _, s := range te.Stats() {
		if s.FnID == fn.ID && s.Prepared+s.Idle+s.Busy+s.Starting > 2 {
			t.Errorf("stats %+v: the holder counted as a function container", s)
		}
	}

	// The call after the scale to zero starts the spare; while it runs
	// (it sleeps until cancelled, so no idle timeout removes the
	// container meanwhile) the spare's process is in the holder's
	// namespace.
	eventually(t, 30*time.Second, "the first container gone after its idle timeout", func() bool { return te.state(first.report.ContainerID) == "gone" })
	callCtx, cancelCall := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = te.Call(callCtx, fn, CallRequest{ID: te.node + "-sleep", Header: http.Header{"X-Test": {"sleep:600000"}}, Body: strings.NewReader("")}, newTimedRecorder())
	}()
	eventually(t, 30*time.Second, "the spare started for the call", func() bool { return te.state(spare) == "running" })
	if a, b := te.netns(holder), te.netns(spare); a != b {
		t.Errorf("the holder's network namespace %s, the started spare's %s; want one", a, b)
	}
	cancelCall()
	<-done

	// The next spare's holder dies: the call after the next scale to zero
	// still succeeds, in a fresh container, and both go.
	spare2, holder2 := te.spareAndHolder(fn.ID, spare)
	if err := te.cli.ContainerKill(ctx, holder2, "KILL"); err != nil {
		t.Fatal(err)
	}
	// The engine removes the holder after its container, so the holder
	// may still be going a moment after the container is gone.
	eventually(t, 30*time.Second, "the second container, and then its holder, gone after its idle timeout", func() bool {
		return te.state(spare) == "gone" && te.state(holder) == "gone"
	})
	third := te.mustCall(fn, "echo", "z")
	if third.report.ContainerID == spare2 {
		t.Fatal("a spare whose holder is dead served a call")
	}
	eventually(t, 30*time.Second, "the spare of a dead holder removed with it", func() bool {
		return te.state(spare2) == "gone" && te.state(holder2) == "gone"
	})

	// Forget: no function container and no holder left.
	te.spareAndHolder(fn.ID, spare2)
	te.Forget(fn.ID)
	eventually(t, 30*time.Second, "nothing of the forgotten function left", func() bool { return len(te.containers()) == 0 })

	// A restarted agent removes what the previous one left, holders too.
	te.mustCall(fn, "echo", "w")
	te.spareAndHolder(fn.ID, "")
	again, err := New(Config{NodeID: te.node, SocketRoot: t.TempDir(), Tracker: NewResourceTracker(Capacity{MemoryBytes: 1 << 30}), NetnsPool: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close(context.Background())
	// The spare, the called container unless its idle timeout passed, and
	// the spare made before the held one unless already replaced (the
	// first engine, alive, may be removing any but the held spare: those
	// are not counted).
	if n, err := again.RemoveOrphans(ctx); err != nil || n < 1 || n > 3 {
		t.Fatalf("RemoveOrphans = %d, %v; want 1 to 3 function containers, holders not counted", n, err)
	}
	if left := te.containers(); len(left) != 0 {
		t.Fatalf("after RemoveOrphans: %d containers left on the node, holders included", len(left))
	}
}

// TestSpareOnNoNetworkHasNoHolder: on a network a holder brings nothing to
// ("none"), the spare is created as before, on that network, and no
// holder is made.
func TestSpareOnNoNetworkHasNoHolder(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, func(c *Config) { c.MaxSpares = 4 }) // Network "none"
	fn := fnConfig(t, "netns-none", rawImage)
	te.mustCall(fn, "echo", "x")
	// The spare the engine registered: a container created beside it and
	// given up at once ("prepared but not needed") may be listed a moment
	// before it is gone, so one that is gone by its inspection is passed.
	var info container.InspectResponse
	eventually(t, 30*time.Second, "a spare prepared", func() bool {
		if te.counts.Snapshot().Containers[ContainerPrepared] != 1 {
			return false
		}
		for _, c := range te.containers() {
			if c.State != "created" || c.Labels[dockerengine.LabelFn] != fn.ID {
				continue
			}
			var err error
			if info, err = te.cli.ContainerInspect(context.Background(), c.ID); err == nil {
				return true
			}
		}
		return false
	})
	if info.HostConfig.NetworkMode != "none" {
		t.Errorf("the spare's network mode %q; want none", info.HostConfig.NetworkMode)
	}
	for _, c := range te.containers() {
		if _, ok := c.Labels[dockerengine.LabelHolder]; ok {
			t.Errorf("a holder %s on a network of none", c.ID)
		}
	}
}

// spareAndHolder waits for a spare of fnID other than not in a holder's
// namespace (a spare is first prepared without one, then replaced:
// holdPrepared), and returns it and its holder (by its network mode),
// checking the holder is labelled with the spare's name.
func (te *testEngine) spareAndHolder(fnID, not string) (spare, holder string) {
	te.t.Helper()
	ctx := context.Background()
	eventually(te.t, 30*time.Second, "a spare prepared in a holder's namespace", func() bool {
		// Registered by the engine first: its create has returned.
		if te.counts.Snapshot().Containers[ContainerPrepared] != 1 {
			return false
		}
		for _, c := range te.containers() {
			if c.State != "created" || c.Labels[dockerengine.LabelFn] != fnID || c.ID == not {
				continue
			}
			info, err := te.cli.ContainerInspect(ctx, c.ID)
			if err == nil && info.HostConfig.NetworkMode.IsContainer() {
				spare, holder = c.ID, info.HostConfig.NetworkMode.ConnectedContainer()
				return true
			}
		}
		return false
	})
	info, err := te.cli.ContainerInspect(ctx, spare)
	if err != nil {
		te.t.Fatalf("the spare: %v", err)
	}
	h, err := te.cli.ContainerInspect(ctx, holder)
	if err != nil {
		te.t.Fatalf("the spare's holder: %v", err)
	}
	if h.Config.Labels[dockerengine.LabelHolder] != info.Name[1:] {
		te.t.Fatalf("the holder's labels %v; want %s=%s", h.Config.Labels, dockerengine.LabelHolder, info.Name[1:])
	}
	return spare, h.ID
}

// netns is the network namespace of container id's process.
func (te *testEngine) netns(id string) string {
	te.t.Helper()
	info, err := te.cli.ContainerInspect(context.Background(), id)
	if err != nil || info.State == nil || info.State.Pid == 0 {
		te.t.Fatalf("inspect %s: %v (not running?)", id, err)
	}
	ns, err := os.Readlink("/proc/" + strconv.Itoa(info.State.Pid) + "/ns/net")
	if err != nil {
		te.t.Fatal(err)
	}
	return ns
}

// TestAwaitNoStarts: a holder's start waits while a launch is in the
// daemon's start, goes once none is, and goes anyway after its limit.
func TestAwaitNoStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		e := &Engine{ctx: ctx, wake: make(chan struct{})}
		e.starts = 1
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.awaitNoStarts(time.Minute)
		}()
		synctest.Wait()
		e.signal() // a wake for something else
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("returned while a start is in flight")
		default:
		}
		e.mu.Lock()
		e.starts = 0
		e.mu.Unlock()
		e.signal()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("still waiting with no start in flight")
		}

		e.starts = 1
		start := time.Now()
		e.awaitNoStarts(time.Minute)
		if waited := time.Since(start); waited != time.Minute {
			t.Fatalf("with a start that never ends it waited %v; want its limit", waited)
		}
	})
}
