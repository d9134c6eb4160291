package nodeagent

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mercator/mercator/internal/logbuffer"

	"github.com/mercator/mercator/nodeproto"
)

// filesHolding lists the files under dir whose bytes contain s.
func filesHolding(t *testing.T, dir, s string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte(s)) {
			found = append(found, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestLaunchSecretsReachTheContainerOnly: a launch's secrets are in the
// container's environment and nowhere the agent writes (its state file,
// its log, the events it delivers), through a restart of the agent and the
// launch's redelivery; a launch that names a secret it does not carry is
// refused without a container, naming the secret, unless the container
// exists already, which it adopts.
func TestLaunchSecretsReachTheContainerOnly(t *testing.T) {
	const secret = "s3cret-for-the-container-only-7d1e"
	rt := newMemRuntime()
	tr := &chanTransport{commands: make(chan nodeproto.Command, 4)}
	dir := t.TempDir()
	logs := &logbuffer.Buffer{}
	logger := WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	withSecret := launch("op1", 5)
	withSecret.LaunchWorkload.Env = map[string]string{"PLAIN": "1"}
	withSecret.LaunchWorkload.SecretNames = []string{"TOKEN"}
	withSecret.LaunchWorkload.Secrets = map[string]string{"TOKEN": secret}
	key := withSecret.LaunchWorkload.WorkloadKey

	stop := startTestAgent(t, rt, tr, dir, logger)
	tr.commands <- withSecret
	waitUntil(t, "the launch's result", func() bool { return len(tr.results("op1")) == 1 })
	stop()
	// Restarted, the agent is handed the launch again, values and all (the
	// control plane attaches them to every sending): it answers with the
	// result it recorded, and makes no second container.
	stop = startTestAgent(t, rt, tr, dir, logger)
	tr.commands <- withSecret
	waitUntil(t, "the redelivered launch's result", func() bool { return len(tr.results("op1")) == 2 })

	rt.mu.Lock()
	env := rt.workloads[key].launch.Environment()
	rt.mu.Unlock()
	if env["TOKEN"] != secret || env["PLAIN"] != "1" {
		t.Errorf("the container's environment has TOKEN %t and PLAIN %q; want both", env["TOKEN"] == secret, env["PLAIN"])
	}
	if n := rt.creates(key); n != 1 {
		t.Errorf("%d creates of the attempt's container, want 1", n)
	}

	// A launch naming a secret it lacks makes no container.
	bare := launch("op2", 5)
	bare.LaunchWorkload.SecretNames = []string{"TOKEN", "KEY"}
	bare.LaunchWorkload.Secrets = map[string]string{"TOKEN": secret}
	tr.commands <- bare
	waitUntil(t, "the refused launch's result", func() bool { return len(tr.results("op2")) == 1 })
	res := tr.results("op2")[0].Result
	if res.Outcome != nodeproto.OutcomeFailed || !strings.Contains(res.Error, "names the secrets KEY but carries no value") {
		t.Errorf("launch without a secret's value: %s %q", res.Outcome, res.Error)
	}
	if n := rt.creates(bare.LaunchWorkload.WorkloadKey); n != 0 {
		t.Errorf("a launch without its secrets made %d containers", n)
	}
	// The launch of an attempt whose container an earlier delivery made
	// (the agent died before recording it), redelivered without the
	// values, adopts that container rather than leave it behind a failure.
	again := launch("op3", 5)
	again.LaunchWorkload.WorkloadKey = key
	again.LaunchWorkload.SecretNames = []string{"TOKEN"}
	tr.commands <- again
	waitUntil(t, "the adopting launch's result", func() bool { return len(tr.results("op3")) == 1 })
	if res := tr.results("op3")[0].Result; res.Outcome != nodeproto.OutcomeOK || rt.creates(key) != 2 {
		t.Errorf("a launch without values of an existing container: %s %q after %d creates; want it adopted", res.Outcome, res.Error, rt.creates(key))
	}
	stop()

	if files := filesHolding(t, dir, secret); len(files) > 0 {
		t.Errorf("the agent wrote the secret to %v", files)
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("the agent's log holds the secret:\n%s", logs.String())
	}
	tr.mu.Lock()
	delivered, _ := json.Marshal(tr.events)
	tr.mu.Unlock()
	if bytes.Contains(delivered, []byte(secret)) {
		t.Errorf("the agent delivered the secret in an event: %s", delivered)
	}
}
