package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// An agent in a process of its own: the mercator binary, built once per
// test binary, run as `mercator agent` against the cluster's control plane.

var mercatorBinary struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

func buildMercator(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("MERCATOR_E2E_BINARY"); bin != "" {
		return bin // a mercator binary built elsewhere (a profiling build, say)
	}
	mercatorBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "mercator-e2e-bin-")
		if err != nil {
			mercatorBinary.err = err
			return
		}
		mercatorBinary.path = filepath.Join(dir, "mercator")
		cmd := exec.Command("go", "build", "-o", mercatorBinary.path, "./cmd/mercator")
		cmd.Dir = repoRoot(t)
		// Static, as scripts/demo.sh builds it: the agent is then its own
		// function output relay (fnagent/outputrelay).
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		mercatorBinary.out, mercatorBinary.err = cmd.CombinedOutput()
	})
	if mercatorBinary.err != nil {
		t.Fatalf("build mercator: %v\n%s", mercatorBinary.err, mercatorBinary.out)
	}
	return mercatorBinary.path
}

// processAgent is a `mercator agent` process.
type processAgent struct {
	t      testing.TB
	nodeID string
	cmd    *exec.Cmd
	done   chan struct{}
	log    string
}

// startProcessAgent invites a node and runs `mercator agent` for it with
// the extra flags; it waits until the node is ready with facts.
func (c *cluster) startProcessAgent(base string, flags ...string) *processAgent {
	c.t.Helper()
	bin := buildMercator(c.t)
	nodeID := uniqueNodeID(c.t, base)
	inv, err := c.client.InviteNode(c.ctx, nodeID, 0)
	if err != nil {
		c.t.Fatalf("invite %s: %v", nodeID, err)
	}
	dir := filepath.Join(c.dataDir, "process-agent-"+nodeID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		c.t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "invitation")
	if err := os.WriteFile(tokenFile, []byte(inv.Token), 0o600); err != nil {
		c.t.Fatal(err)
	}
	logPath := filepath.Join(dir, "agent.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		c.t.Fatal(err)
	}
	args := append([]string{"agent", "--control-plane", c.url, "--node-id", nodeID, "--state", filepath.Join(dir, "state"),
		"--token-file", tokenFile, "--heartbeat", "500ms", "--log-level", "info"}, flags...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start agent: %v", err)
	}
	p := &processAgent{t: c.t, nodeID: nodeID, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	c.t.Cleanup(func() {
		p.stop()
		removeContainers(c.t, []string{nodeID})
	})
	c.waitFor("process agent "+nodeID+" ready with facts", func() bool {
		select {
		case <-p.done:
			data, _ := os.ReadFile(logPath)
			c.t.Fatalf("agent process exited:\n%s", data)
		default:
		}
		n, err := c.client.GetNode(c.ctx, nodeID)
		return err == nil && n.Status == "ready" && n.Facts != nil && (*n.Facts)["functions"] != nil
	})
	return p
}

// stop ends the agent as an operator would (SIGTERM), which removes its
// function containers.
func (p *processAgent) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// kill ends the agent the way a crash does: SIGKILL, containers left
// behind.
func (p *processAgent) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

func execOutput(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	return string(out), err
}
