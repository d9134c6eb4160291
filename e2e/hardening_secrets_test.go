package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mercator/mercator/internal/logbuffer"

	dockerclient "github.com/docker/docker/client"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/nodeagent/dockerruntime"
	"github.com/mercator/mercator/nodeproto"
)

// count is how many times s went over the wire, either way.
func (w *wireRecorder) count(s string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Count(w.buf.Bytes(), []byte(s))
}

// TestRunSecretNowhereButTheLaunchAndTheContainer: a Run submitted with
// `run submit --secret-file` gets its secret in the container's
// environment (the workload prints the value's SHA-256, never the value),
// and the value is found nowhere else: not in any file under the data
// directory (the SQLite database and its WAL, the agent's bbolt state, the
// keys, the content), not in the server's or the agent's log, not in any
// API read of the run (get, list, wait, logs, the audit log) or the CLI's
// printing of them; and on the wire between the node and the control plane
// only inside the launch command. The daemon holds it in the container's
// configuration, which is where environment delivery puts it (documented
// in docs/hardening.md, "Run secrets").
func TestRunSecretNowhereButTheLaunchAndTheContainer(t *testing.T) {
	raw := make([]byte, 16)
	rand.Read(raw)
	secret := "run-secret-" + hex.EncodeToString(raw)
	sum := sha256.Sum256([]byte(secret))
	var serverLog, agentLog logbuffer.Buffer
	c := startArtifactCluster(t, nil, artifactClusterOptions{mutate: func(o *daemon.ServerOptions) { o.Logger = slogTo(&serverLog) }})
	wire := c.recordWire()
	node := c.startArtifactAgent("n", 0, &agentLog)

	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(c.mercator("run", "submit", "--image", c.workload, "--env", "PLAIN=1",
		"--secret-file", "TOKEN="+file, "--", "env-sha256", "TOKEN"))
	done := c.wait(id)
	if done.Status != api.RunSucceeded {
		t.Fatalf("run = %s (%s %s) logs %q", done.Status, done.Reason, attemptErrors(done), c.logs(id))
	}
	if logs := c.logsHaving(id, hex.EncodeToString(sum[:])); !strings.Contains(logs, hex.EncodeToString(sum[:])) {
		t.Fatalf("the container did not see the secret: it printed %q, want the SHA-256 of the value", logs)
	}
	if done.Secrets["TOKEN"] != api.SecretRedacted || done.Env["PLAIN"] != "1" {
		t.Errorf("the run as read shows secrets %v and env %v; want TOKEN redacted beside PLAIN", done.Secrets, done.Env)
	}

	// Every read of the run, through the API and through the CLI.
	reads := map[string]string{}
	for _, path := range []string{"/v1/runs/" + id, "/v1/runs", "/v1/runs/" + id + "/wait", "/v1/runs/" + id + "/logs", "/v1/audit"} {
		reads["GET "+path] = c.get(path)
	}
	for _, args := range [][]string{{"run", "get", id}, {"run", "get", id, "-o", "json"}, {"run", "ls"}, {"run", "logs", id}, {"audit", "ls"}} {
		reads["mercator "+strings.Join(args, " ")] = c.mercator(args...)
	}
	if !strings.Contains(reads["GET /v1/runs/"+id], `"TOKEN"`) {
		t.Errorf("GET /v1/runs/%s does not name the secret: %s", id, reads["GET /v1/runs/"+id])
	}
	for what, body := range reads {
		if strings.Contains(body, secret) {
			t.Errorf("%s shows the secret: %s", what, body)
		}
	}

	// No file the server or the agent wrote holds it.
	if files := filesHolding(t, c.dataDir, secret); len(files) > 0 {
		t.Errorf("files under the data directory hold the secret: %v", files)
	}
	if files := filesHolding(t, c.dataDir, id); len(files) == 0 {
		t.Errorf("no file under the data directory holds run %s itself, so searching them proves nothing", id)
	}
	entries, _ := os.ReadDir(c.dataDir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.ContainsFunc(names, func(n string) bool { return strings.HasSuffix(n, ".db") || strings.HasSuffix(n, "-wal") }) ||
		!slices.Contains(names, "agent-"+node) {
		t.Fatalf("the data directory holds %v: no database or no agent state to search, which would prove nothing", names)
	}
	for what, log := range map[string][2]string{"the server's log": {serverLog.String(), id}, "the agent's log": {agentLog.String(), nodeproto.KindLaunchWorkload}} {
		log, mention := log[0], log[1]
		if !strings.Contains(log, mention) {
			t.Errorf("%s never mentions %s, so searching it proves nothing", what, mention)
		}
		if strings.Contains(log, secret) {
			t.Errorf("%s holds the secret", what)
		}
	}

	// On the wire, only inside the one launch sent to the node.
	inLaunch := `"secret_names":["TOKEN"],"secrets":{"TOKEN":"` + secret + `"}`
	if got, launches := wire.count(secret), wire.count(inLaunch); got == 0 || got != launches {
		t.Errorf("the secret went over the wire %d times, %d of them inside a launch; want only inside launches", got, launches)
	}

	// The daemon's container configuration is where environment delivery
	// puts it: the one place on the node.
	docker, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer docker.Close()
	info, err := docker.ContainerInspect(c.ctx, dockerruntime.ContainerName(nodeproto.WorkloadKey{RunID: id, Attempt: 1}))
	if err != nil || !slices.Contains(info.Config.Env, "TOKEN="+secret) {
		t.Errorf("the container's configuration lacks TOKEN (%v): the secret did not reach it as documented", err)
	}
}

// get is the body of an authenticated GET of path on the control plane.
func (c *cluster) get(path string) string {
	c.t.Helper()
	req, err := http.NewRequestWithContext(c.ctx, "GET", c.url+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		c.t.Fatalf("GET %s = %d %s (%v)", path, resp.StatusCode, body, err)
	}
	return string(body)
}

// filesHolding lists the files under dir whose bytes contain s. A file
// that vanishes while it is walked (a temporary file) is skipped.
func filesHolding(t testing.TB, dir, s string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err == nil && bytes.Contains(b, []byte(s)) {
			found = append(found, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}
