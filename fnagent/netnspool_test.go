package fnagent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/dockerengine"
)

// pooled lists the running holders of te's pool on the daemon.
func (te *testEngine) pooled() []string {
	te.t.Helper()
	var ids []string
	for _, c := range te.containers() {
		if strings.HasPrefix(c.Labels[dockerengine.LabelHolder], te.poolPrefix) && c.State == "running" {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// TestNetnsPool, on the daemon's default bridge: the engine keeps its pool
// of holders started before any function is seen; a cold launch with no
// spare joins one of them (the call's container in the holder's
// namespace) and the pool is filled again; a pooled holder goes with the
// container that took it; a restarted agent removes the pool a previous
// one left, and Close removes its own (checked by newTestEngine).
func TestNetnsPool(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, func(c *Config) { c.Network = ""; c.NetnsPool = 2 })
	ctx := context.Background()
	eventually(t, 30*time.Second, "two holders pooled before any call", func() bool { return len(te.pooled()) == 2 })
	before := te.pooled()

	fn := fnConfig(t, "pool", rawImage)
	fn.IdleTimeout = time.Minute
	first := te.mustCall(fn, "echo", "x")
	if !first.report.Cold {
		t.Fatal("the first call was not a cold start")
	}
	info, err := te.cli.ContainerInspect(ctx, first.report.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	holder := info.HostConfig.NetworkMode.ConnectedContainer()
	if !info.HostConfig.NetworkMode.IsContainer() || (holder != before[0] && holder != before[1]) {
		t.Fatalf("the cold launch's network mode %q; want one of the pooled holders %v", info.HostConfig.NetworkMode, before)
	}
	if a, b := te.netns(holder), te.netns(first.report.ContainerID); a != b {
		t.Errorf("the holder's network namespace %s, the container's %s; want one", a, b)
	}
	eventually(t, 30*time.Second, "the pool filled again", func() bool {
		now := te.pooled()
		return len(now) == 3 // two ready, and the one taken
	})

	// The taken holder goes with its container.
	te.Forget(fn.ID)
	eventually(t, 30*time.Second, "the container and its holder gone", func() bool {
		return te.state(first.report.ContainerID) == "gone" && te.state(holder) == "gone"
	})
	if n := len(te.pooled()); n != 2 {
		t.Errorf("%d holders pooled after the function was forgotten; want 2", n)
	}

	// A restarted agent removes the pool the previous one left.
	again, err := New(Config{NodeID: te.node, SocketRoot: t.TempDir(), Tracker: NewResourceTracker(Capacity{MemoryBytes: 1 << 30}), NetnsPool: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close(context.Background())
	if n, err := again.RemoveOrphans(ctx); err != nil || n != 0 {
		t.Fatalf("RemoveOrphans = %d, %v; want 0 function containers, holders not counted", n, err)
	}
	if left := te.containers(); len(left) != 0 {
		t.Fatalf("after RemoveOrphans: %d containers left on the node", len(left))
	}
}

// TestNetnsPoolOff: with the pool off, or on a network a holder brings
// nothing to, no holder is made ahead.
func TestNetnsPoolOff(t *testing.T) {
	t.Parallel()
	for _, configure := range []func(*Config){
		func(c *Config) { c.Network = ""; c.NetnsPool = -1 },
		func(c *Config) { c.Network = "none"; c.NetnsPool = 2 },
	} {
		te := newTestEngine(t, configure)
		fn := fnConfig(t, "nopool", rawImage)
		r := te.mustCall(fn, "echo", "x")
		info, err := te.cli.ContainerInspect(context.Background(), r.report.ContainerID)
		if err != nil {
			t.Fatal(err)
		}
		if info.HostConfig.NetworkMode.IsContainer() {
			t.Errorf("network %q, pool %d: the container joined %q", te.cfg.Network, te.cfg.NetnsPool, info.HostConfig.NetworkMode)
		}
		if n := len(te.pooled()); n != 0 {
			t.Errorf("network %q, pool %d: %d holders pooled", te.cfg.Network, te.cfg.NetnsPool, n)
		}
	}
}
