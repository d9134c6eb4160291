package devenv

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/testimage"
)

// devUp is one `mercator dev` in this process.
type devUp struct {
	url, registry string
	stop          func() error
}

// startDev runs Run on dataDir for node nodeID, on free loopback ports,
// until stop; the node's containers are removed when the test ends.
func startDev(t *testing.T, dataDir, contextPath, nodeID string) devUp {
	t.Helper()
	t.Cleanup(func() {
		out, _ := exec.Command("docker", "ps", "-aq", "--filter", "label=mercator.node="+nodeID).Output()
		if ids := strings.Fields(string(out)); len(ids) > 0 {
			exec.Command("docker", append([]string{"rm", "-f"}, ids...)...).Run()
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{DataDir: dataDir, Listen: "127.0.0.1:0", Registry: "127.0.0.1:0", NodeID: nodeID,
			ContextPath: contextPath, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Ready: func(url, registry string) { ready <- [2]string{url, registry} }})
	}()
	select {
	case r := <-ready:
		stopped := false
		stop := func() error {
			if stopped {
				return nil
			}
			stopped = true
			cancel()
			return <-done
		}
		t.Cleanup(func() { stop() })
		return devUp{url: r[0], registry: r[1], stop: stop}
	case err := <-done:
		cancel()
		t.Fatalf("mercator dev did not come up: %v", err)
	case <-time.After(2 * time.Minute): // a hang guard
		cancel()
		t.Fatal("mercator dev did not come up within 2 minutes")
	}
	return devUp{}
}

// TestDevRunsAWorkloadAndKeepsItsState is `mercator dev`'s smoke test, as
// the README walks it: dev comes up with a registry and a local node, the
// CLI's context file it wrote is all a client needs, an image pushed to its
// registry runs on the local Docker daemon, and after a restart on the same
// data directory the run is still there and new work runs.
func TestDevRunsAWorkloadAndKeepsItsState(t *testing.T) {
	dataDir := t.TempDir()
	contextPath := filepath.Join(t.TempDir(), "context.json")
	ctx := context.Background()
	// Not "local": a real `mercator dev` may share this Docker daemon.
	nodeID := fmt.Sprintf("devenv-test-%d", time.Now().UnixNano())
	run := func(dev devUp, word string) api.Run {
		t.Helper()
		cfg, err := client.LoadConfig(func(k string) string {
			if k == client.EnvConfig {
				return contextPath
			}
			return ""
		})
		if err != nil {
			t.Fatalf("the CLI's configuration from dev's context file: %v", err)
		}
		if cfg.Addr != dev.url {
			t.Fatalf("the context file names %s, dev listens on %s", cfg.Addr, dev.url)
		}
		// As the CLI does: the context names dev's CA, which the client
		// must trust (dev serves TLS).
		c, err := client.NewFromConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		image, err := testimage.Publish(ctx, testimage.Workload, dev.registry)
		if err != nil {
			t.Fatalf("push to dev's registry: %v", err)
		}
		submitted, err := c.SubmitRun(ctx, api.RunSpec{Image: image, Command: []string{"echo", word}})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		done, err := c.WaitRun(wctx, submitted.ID)
		if err != nil || done.Status != api.RunSucceeded || len(done.Attempts) != 1 || done.Attempts[0].NodeID != nodeID {
			t.Fatalf("run on dev: %v %s %q %+v", err, done.Status, done.Reason, done.Attempts)
		}
		var logs strings.Builder
		if err := c.Logs(ctx, done.ID, false, &logs); err != nil || !strings.Contains(logs.String(), word) {
			t.Fatalf("logs: %v %q", err, logs.String())
		}
		return done
	}

	dev := startDev(t, dataDir, contextPath, nodeID)
	first := run(dev, "first")
	if err := dev.stop(); err != nil {
		t.Fatalf("dev stopped with %v, want a clean stop", err)
	}
	// Stopped means stopped: the local agent's function containers and
	// network namespace holders (fnagent's pool, kept from its start) are
	// gone by the time Run returns.
	for _, label := range []string{"mercator.fn", "mercator.fn.holder"} {
		out, err := exec.Command("docker", "ps", "-aq", "--filter", "label=mercator.node="+nodeID, "--filter", "label="+label).Output()
		if err != nil {
			t.Fatal(err)
		}
		if left := strings.Fields(string(out)); len(left) > 0 {
			t.Errorf("%d containers labelled %s left after dev stopped", len(left), label)
		}
	}

	dev = startDev(t, dataDir, contextPath, nodeID)
	run(dev, "second")
	cfg, err := client.LoadConfig(func(k string) string {
		if k == client.EnvConfig {
			return contextPath
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewFromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := c.GetRun(ctx, first.ID)
	if err != nil || kept.Status != api.RunSucceeded {
		t.Fatalf("the first run after a restart on the same data: %v %s", err, kept.Status)
	}
}
