package e2e

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/internal/faultproxy"
)

// Fleet upgrades (docs/upgrades.md): a real `mercator agent` process,
// built at one version, upgraded through the control plane to another
// build while a Run sleeps, then refused a corrupted release and a binary
// that cannot start.

// agentBuilds holds the builds of this test binary, by agent version.
var agentBuilds sync.Map

// buildAgentVersion builds the mercator binary with its agent version set
// to version, once per test binary, into dir.
func buildAgentVersion(t *testing.T, dir, version string) string {
	t.Helper()
	if p, ok := agentBuilds.Load(version); ok {
		return p.(string)
	}
	out := filepath.Join(dir, version, "mercator")
	cmd := exec.Command("go", "build", "-ldflags", "-X github.com/mercator/mercator/nodeagent.Version="+version, "-o", out, "./cmd/mercator")
	cmd.Dir = repoRoot(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", version, err, b)
	}
	agentBuilds.Store(version, out)
	return out
}

func copyExecutable(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) pushRelease(path, version string) api.AgentRelease {
	c.t.Helper()
	f, err := os.Open(path)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	rel, err := c.client.PushAgentRelease(c.ctx, version, runtime.GOOS+"/"+runtime.GOARCH, f, st.Size(), nil)
	if err != nil {
		c.t.Fatalf("push release %s: %v", version, err)
	}
	return rel
}

// rollout upgrades node to version and waits until the rollout ends.
func (c *cluster) rollout(node, version string) api.Rollout {
	return c.rolloutWithin(node, version, 60)
}

// rolloutWithin is rollout with the new agent's deadline, in seconds.
func (c *cluster) rolloutWithin(node, version string, deadline int) api.Rollout {
	c.t.Helper()
	ro, err := c.client.StartRollout(c.ctx, api.RolloutRequest{Nodes: []string{node}, Version: version, Platform: runtime.GOOS + "/" + runtime.GOARCH, DeadlineSeconds: deadline})
	if err != nil {
		c.t.Fatalf("start rollout to %s: %v", version, err)
	}
	c.waitFor("rollout "+ro.ID+" to end", func() bool {
		ro, err = c.client.GetRollout(c.ctx, ro.ID)
		return err == nil && ro.State != api.RolloutRunning
	})
	return ro
}

func (c *cluster) agentVersion(node string) string {
	n, err := c.client.GetNode(c.ctx, node)
	if err != nil || n.Facts == nil {
		return ""
	}
	v, _ := (*n.Facts)["agent_version"].(string)
	return v
}

// upgradeBuilds is a directory for the builds, left behind as
// buildMercator's is (builds are cached for the test binary's life).
func upgradeBuilds(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mercator-e2e-upgrade-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestUpgradeKeepsRunningWork(t *testing.T) {
	c := startCluster(t)
	bins := upgradeBuilds(t)
	v1 := buildAgentVersion(t, bins, "e2e-v1")
	v2 := buildAgentVersion(t, bins, "e2e-v2")
	// The agent runs from a directory of its own, which it rewrites.
	agentDir := t.TempDir()
	agentBin := filepath.Join(agentDir, "mercator")
	copyExecutable(t, v1, agentBin)
	t.Setenv("MERCATOR_E2E_BINARY", agentBin)
	p := c.startProcessAgent("upg")
	node := p.nodeID
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", readFile(p.log))
		}
	})
	if v := c.agentVersion(node); v != "e2e-v1" {
		t.Fatalf("node reports agent version %q before the upgrade", v)
	}

	run := c.submit(api.RunSpec{Command: []string{"sleep", "20"}, ReplaceAfterSeconds: -1})
	var before api.Run
	c.waitFor("the run running", func() bool {
		before, _ = c.client.GetRun(c.ctx, run.ID)
		return before.Status == api.RunRunning && len(before.Attempts) == 1 && before.Attempts[0].ContainerID != ""
	})
	// A function with a hot container, called back to back through the
	// upgrade: the calls that fail are counted, not hidden.
	_, fn := c.deployHello("upg", api.Fn{})
	if status, _ := c.invoke(fn.ID, `{}`); status != 200 {
		t.Fatal("warm-up call failed")
	}
	type callStats struct {
		ok, failed        int
		byStatus          map[int]int // the failures, by status (0: no answer)
		firstErr          string
		firstFail, lastOK time.Time
		lastFail          time.Time
	}
	stopCalls, callsDone := make(chan struct{}), make(chan callStats)
	go func() {
		st := callStats{byStatus: map[int]int{}}
		for {
			select {
			case <-stopCalls:
				callsDone <- st
				return
			default:
			}
			res, err := c.client.Invoke(c.ctx, fn.ID, strings.NewReader(`{}`), nil, io.Discard)
			switch {
			case err == nil && res.Status == 200:
				st.ok++
			default:
				if st.failed == 0 {
					st.firstErr, st.firstFail = fmt.Sprintf("status %d, %v", res.Status, err), time.Now()
				}
				st.failed++
				st.byStatus[res.Status]++
				st.lastFail = time.Now()
			}
		}
	}()
	c.pushRelease(v2, "e2e-v2")
	ro := c.rollout(node, "e2e-v2")
	close(stopCalls)
	calls := <-callsDone
	t.Logf("function calls during the upgrade: %d ok, %d failed over %v (by status %v; first: %s)", calls.ok, calls.failed,
		calls.lastFail.Sub(calls.firstFail).Round(time.Millisecond), calls.byStatus, calls.firstErr)
	if status, _ := c.invoke(fn.ID, `{}`); status != 200 {
		t.Fatal("the function does not answer after the upgrade")
	}
	if ro.State != api.RolloutSucceeded {
		t.Fatalf("rollout %s: %s (%s); agent log:\n%s", ro.ID, ro.State, ro.Reason, readFile(p.log))
	}
	if r, _ := c.client.GetRun(c.ctx, run.ID); r.Status != api.RunRunning {
		t.Fatalf("the run was %s when the upgrade finished: it must sleep through it (lengthen its sleep)", r.Status)
	}
	if v := c.agentVersion(node); v != "e2e-v2" {
		t.Fatalf("node reports %q after the upgrade", v)
	}
	select {
	case <-p.done:
		t.Fatalf("the agent process exited during the upgrade:\n%s", readFile(p.log))
	default: // same process ID: re-exec'd in place
	}
	if b, _ := os.ReadFile(agentBin + ".prev"); !bytes.Equal(b, mustRead(t, v1)) {
		t.Error("the previous binary was not kept as .prev")
	}

	done := c.wait(run.ID)
	at := done.Attempts[0]
	if done.Status != api.RunSucceeded || at.ExitCode == nil || *at.ExitCode != 0 || len(done.Attempts) != 1 {
		t.Fatalf("run after the upgrade: %s, attempts %+v", done.Status, done.Attempts)
	}
	if at.ContainerID != before.Attempts[0].ContainerID {
		t.Fatalf("container %s after the upgrade, %s before: not adopted", at.ContainerID, before.Attempts[0].ContainerID)
	}
	if n := containersFor(t, run.ID); n != 1 {
		t.Fatalf("%d containers for the run, want exactly one", n)
	}
	if got := c.logs(run.ID); got != "sleeping\nslept\n" {
		t.Fatalf("log after the upgrade: %q", got)
	}

	// A corrupted release: the bytes in the content store no longer hash
	// to the release's SHA-256. The node refuses it; the rollout stops.
	corrupt := c.pushRelease(v1, "e2e-v3")
	corruptContent(t, c.dataDir, corrupt.SHA256)
	ro = c.rollout(node, "e2e-v3")
	if ro.State != api.RolloutStopped || !strings.Contains(ro.Reason, "hashes to") {
		t.Fatalf("corrupted release: rollout %s (%s)", ro.State, ro.Reason)
	}
	// A binary that cannot start: refused by the probe, nothing replaced.
	bad := filepath.Join(bins, "bad")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c.pushRelease(bad, "e2e-bad")
	ro = c.rollout(node, "e2e-bad")
	if ro.State != api.RolloutStopped || !strings.Contains(ro.Reason, "does not start") {
		t.Fatalf("binary that exits at start: rollout %s (%s)", ro.State, ro.Reason)
	}
	if v := c.agentVersion(node); v != "e2e-v2" {
		t.Fatalf("node reports %q after two refused upgrades, want e2e-v2", v)
	}
	if b, _ := os.ReadFile(agentBin); !bytes.Equal(b, mustRead(t, v2)) {
		t.Fatal("a refused release replaced the agent's binary")
	}
	if n, err := c.client.GetNode(c.ctx, node); err != nil || n.Status != api.NodeReady {
		t.Fatalf("node after the refusals: %v %v", n.Status, err)
	}
}

// TestUpgradeRollsBackWhenNotBack: the new agent cannot reach the control
// plane (the network to it is cut right after the upgrade command went
// down), so it does not come back connected by its deadline: it restores
// the previous binary and execs it, and that agent, once it reaches the
// control plane again, reports the failed upgrade with its reason. The
// rollout stops and the node runs the previous version.
func TestUpgradeRollsBackWhenNotBack(t *testing.T) {
	c := startCluster(t)
	bins := upgradeBuilds(t)
	v1 := buildAgentVersion(t, bins, "e2e-v1")
	v2 := buildAgentVersion(t, bins, "e2e-v2")
	agentDir := t.TempDir()
	agentBin := filepath.Join(agentDir, "mercator")
	copyExecutable(t, v1, agentBin)
	t.Setenv("MERCATOR_E2E_BINARY", agentBin)
	tap := &commandTap{seen: make(chan struct{})}
	proxy, err := faultproxy.Start(strings.TrimPrefix(c.url, "http://"), faultproxy.WithTap(tap))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	p := c.startProcessAgent("rb", "--control-plane", "http://"+proxy.Addr())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", readFile(p.log))
		}
	})
	c.pushRelease(v2, "e2e-v2")
	go func() {
		<-tap.seen
		proxy.Cut() // the upgrade command went down; nothing reaches the control plane now
	}()
	ro, err := c.client.StartRollout(c.ctx, api.RolloutRequest{Nodes: []string{p.nodeID}, Version: "e2e-v2", Platform: runtime.GOOS + "/" + runtime.GOARCH, DeadlineSeconds: 3})
	if err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(c.dataDir, "process-agent-"+p.nodeID, "state", "upgrade.json")
	c.waitFor("the agent to roll itself back", func() bool {
		b, _ := os.ReadFile(record)
		return strings.Contains(string(b), `"failed"`)
	})
	if b := mustRead(t, agentBin); !bytes.Equal(b, mustRead(t, v1)) {
		t.Fatal("after the rollback the binary is not the previous one")
	}
	proxy.Restore()
	c.waitFor("rollout "+ro.ID+" to stop", func() bool {
		ro, err = c.client.GetRollout(c.ctx, ro.ID)
		return err == nil && ro.State != api.RolloutRunning
	})
	if ro.State != api.RolloutStopped || !strings.Contains(ro.Reason, "rolled back to e2e-v1") || !strings.Contains(ro.Reason, "did not come back connected") {
		t.Fatalf("rollout %s: %q", ro.State, ro.Reason)
	}
	c.waitFor("the node back on e2e-v1", func() bool {
		n, err := c.client.GetNode(c.ctx, p.nodeID)
		return err == nil && n.Status == api.NodeReady && c.agentVersion(p.nodeID) == "e2e-v1"
	})
	select {
	case <-p.done:
		t.Fatalf("the agent process exited:\n%s", readFile(p.log))
	default: // the same process throughout: exec'd twice
	}
}

// commandTap closes seen when an upgrade_agent command goes down to the
// agent, and closes that connection right after forwarding it.
type commandTap struct {
	once sync.Once
	seen chan struct{}
}

func (c *commandTap) Data(_ uint64, dir faultproxy.Direction, p []byte) faultproxy.Verdict {
	if dir == faultproxy.ServerToClient && bytes.Contains(p, []byte(`"upgrade_agent"`)) {
		c.once.Do(func() { close(c.seen) })
		return faultproxy.ForwardThenClose
	}
	return faultproxy.Forward
}

func (c *commandTap) Closed(uint64) {}

// corruptContent flips a byte of the content stored under digest in the
// server's local content store.
func corruptContent(t *testing.T, dataDir, digest string) {
	t.Helper()
	found := ""
	filepath.WalkDir(dataDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == digest {
			found = path
		}
		return nil
	})
	if found == "" {
		t.Fatalf("content %s not found under %s", digest, dataDir)
	}
	b := mustRead(t, found)
	b[len(b)/2] ^= 0xff
	os.Chmod(found, 0o644)
	if err := os.WriteFile(found, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
