package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
)

func intp(i int) *int                           { return &i }
func timep(d time.Duration) *time.Time          { t := t0.Add(d); return &t }
func factsp(m map[string]any) *api.NodeFactsDoc { d := api.NodeFactsDoc(m); return &d }

func TestSubmitPrintsOnlyTheID(t *testing.T) {
	f := newFakeAPI(t)
	res := f.cli(t, "run", "submit", "--image", "alpine:3", "--cpu", "0.5", "--memory", "64MiB",
		"--timeout", "30m", "--retries", "2", "--env", "A=1", "--env", "B=x=y", "--env", "EMPTY=",
		"--", "sh", "-c", "echo hi")
	if res.code != 0 {
		t.Fatalf("exit %d, stderr %q", res.code, res.stderr)
	}
	if res.stdout != "r-1\n" {
		t.Errorf("stdout = %q, want the ID alone", res.stdout)
	}
	want := api.RunSpec{Image: "alpine:3", Command: []string{"sh", "-c", "echo hi"},
		Env: map[string]string{"A": "1", "B": "x=y", "EMPTY": ""}, CPU: 0.5, MemoryBytes: 64 << 20,
		TimeoutSeconds: 1800, Retries: 2}
	if !reflect.DeepEqual(f.submits[0], want) {
		t.Errorf("submitted %+v\nwant %+v", f.submits[0], want)
	}
}

// TestSubmitContainment: --user, --read-only, --network and --pids-limit
// reach the spec as its containment fields.
func TestSubmitContainment(t *testing.T) {
	f := newFakeAPI(t)
	res := f.cli(t, "run", "submit", "--image", "alpine:3", "--user", "1000:1000", "--read-only",
		"--network", "none", "--pids-limit", "9000", "--", "true")
	if res.code != 0 {
		t.Fatalf("exit %d, stderr %q", res.code, res.stderr)
	}
	want := api.RunSpec{Image: "alpine:3", Command: []string{"true"}, User: "1000:1000", ReadOnlyRootfs: true, Network: "none", PidsLimit: 9000}
	if !reflect.DeepEqual(f.submits[0], want) {
		t.Errorf("submitted %+v\nwant %+v", f.submits[0], want)
	}
}

// TestSubmitCount: --count N goes through the batch route in calls of at
// most api.MaxRunBatch, gives copy i MERCATOR_RUN_INDEX=i beside the
// --env variables, and prints every ID, one per line in index order, and
// nothing else.
func TestSubmitCount(t *testing.T) {
	f := newFakeAPI(t)
	const n = 2*api.MaxRunBatch + 500
	res := f.cli(t, "run", "submit", "--image", "alpine:3", "--env", "A=1", "--count", strconv.Itoa(n), "--", "sh", "-c", "echo $MERCATOR_RUN_INDEX")
	if res.code != 0 {
		t.Fatalf("exit %d, stderr %q", res.code, res.stderr)
	}
	if res.stderr != "" {
		t.Errorf("stderr = %q, want nothing", res.stderr)
	}
	var want strings.Builder
	for i := range n {
		fmt.Fprintf(&want, "r-%d\n", i+1)
	}
	if res.stdout != want.String() {
		t.Errorf("stdout is not the %d IDs one per line (first 100 bytes: %q)", n, res.stdout[:min(100, len(res.stdout))])
	}
	if f.batches != 3 || len(f.submits) != n {
		t.Fatalf("%d batch calls created %d runs, want 3 calls and %d runs", f.batches, len(f.submits), n)
	}
	for i, spec := range f.submits {
		if spec.Env["MERCATOR_RUN_INDEX"] != strconv.Itoa(i) || spec.Env["A"] != "1" || len(spec.Env) != 2 || spec.Command[2] != "echo $MERCATOR_RUN_INDEX" {
			t.Fatalf("run %d was submitted with env %v, command %q", i, spec.Env, spec.Command)
		}
	}
	for _, r := range f.requests {
		if r.URL.Path != "/v1/runs/batch" {
			t.Errorf("request %s %s; --count sends only batches", r.Method, r.URL.Path)
		}
	}

	// --count 1 is a sweep of one: MERCATOR_RUN_INDEX=0, through the batch.
	f = newFakeAPI(t)
	res = f.cli(t, "run", "submit", "--image", "alpine:3", "--count", "1", "true")
	if res.code != 0 || res.stdout != "r-1\n" || f.batches != 1 || f.submits[0].Env["MERCATOR_RUN_INDEX"] != "0" {
		t.Errorf("--count 1: exit %d, stdout %q, %d batches, env %v", res.code, res.stdout, f.batches, f.submits[0].Env)
	}
	// Without --count, MERCATOR_RUN_INDEX is the user's to set.
	f = newFakeAPI(t)
	res = f.cli(t, "run", "submit", "--image", "alpine:3", "--env", "MERCATOR_RUN_INDEX=7", "true")
	if res.code != 0 || f.batches != 0 || f.submits[0].Env["MERCATOR_RUN_INDEX"] != "7" {
		t.Errorf("without --count: exit %d, %d batches, env %v", res.code, f.batches, f.submits[0].Env)
	}
}

func TestSubmitCountJSON(t *testing.T) {
	f := newFakeAPI(t)
	res := f.cli(t, "run", "submit", "--image", "alpine:3", "--count", "3", "-o", "json", "true")
	if res.code != 0 {
		t.Fatalf("exit %d, stderr %q", res.code, res.stderr)
	}
	var list api.RunList
	if err := json.Unmarshal([]byte(res.stdout), &list); err != nil {
		t.Fatalf("stdout %q: %v", res.stdout, err)
	}
	if len(list.Runs) != 3 || list.Runs[2].ID != "r-3" || list.Runs[2].Env["MERCATOR_RUN_INDEX"] != "2" {
		t.Errorf("runs = %+v", list.Runs)
	}
}

// TestSubmitCountFailures: a call that fails after others succeeded leaves
// the IDs created on stdout and says on stderr how many were created and
// which indexes were not; a spec the server refuses creates nothing.
func TestSubmitCountFailures(t *testing.T) {
	f := newFakeAPI(t)
	f.failBatch = 2
	res := f.cli(t, "run", "submit", "--image", "alpine:3", "--count", "2500", "true")
	if res.code != 1 {
		t.Fatalf("exit %d, want 1; stderr %q", res.code, res.stderr)
	}
	ids := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
	if len(ids) != api.MaxRunBatch || ids[0] != "r-1" || ids[len(ids)-1] != "r-1000" {
		t.Errorf("stdout holds %d lines (%q … %q), want the 1000 IDs created", len(ids), ids[0], ids[len(ids)-1])
	}
	for _, says := range []string{"1000 of 2500 runs were created (indexes 0 to 999", "indexes 1000 to 2499 were not", "error: ", "the database is unreachable"} {
		if !strings.Contains(res.stderr, says) {
			t.Errorf("stderr %q does not say %q", res.stderr, says)
		}
	}

	f = newFakeAPI(t)
	res = f.cli(t, "run", "submit", "--image", "bad", "--count", "3", "true")
	if res.code != 1 || res.stdout != "" || !strings.Contains(res.stderr, "runs[0].image: cannot resolve") || strings.Contains(res.stderr, "were created") {
		t.Errorf("refused batch: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	if len(f.submits) != 0 {
		t.Errorf("%d runs created", len(f.submits))
	}
}

// TestSubmitResendsUnderOneKey: a submission whose answer is lost (the
// run created, the connection closed) is sent again under the same
// idempotency key, and the run the first call created is the answer: one
// run, its ID printed once.
func TestSubmitResendsUnderOneKey(t *testing.T) {
	f := newFakeAPI(t)
	f.loseFirst = true
	res := f.cli(t, "run", "submit", "--image", "alpine:3", "true")
	if res.code != 0 || res.stdout != "r-1\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0 and r-1", res.code, res.stdout, res.stderr)
	}
	if !strings.Contains(res.stderr, "sending the submission again") || !strings.Contains(res.stderr, "same idempotency key") {
		t.Errorf("stderr %q does not say the submission was sent again under its key", res.stderr)
	}
	var keys []string
	for _, r := range f.requests {
		if r.Method == "POST" && r.URL.Path == "/v1/runs" {
			keys = append(keys, r.Header.Get(api.HeaderIdempotencyKey))
		}
	}
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Errorf("the submission's keys were %q; want two sends under one key", keys)
	}
	if len(f.submits) != 1 {
		t.Errorf("%d runs created, want 1", len(f.submits))
	}
}

func TestSubmitCommandHandling(t *testing.T) {
	cases := map[string]struct {
		args []string
		want []string
	}{
		"after --":            {[]string{"--image", "x", "--", "--not-a-flag", "-c", "y"}, []string{"--not-a-flag", "-c", "y"}},
		"without --":          {[]string{"--image", "x", "echo", "--flag-of-echo"}, []string{"echo", "--flag-of-echo"}},
		"-- twice":            {[]string{"--image=x", "--", "sh", "--", "z"}, []string{"sh", "--", "z"}},
		"flags after --image": {[]string{"--image", "x", "-o", "table", "--", "true"}, []string{"true"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFakeAPI(t)
			res := f.cli(t, append([]string{"run", "submit"}, tc.args...)...)
			if res.code != 0 {
				t.Fatalf("exit %d: %s", res.code, res.stderr)
			}
			if got := f.submits[0].Command; !reflect.DeepEqual(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
				t.Errorf("command = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	cases := map[string]struct {
		args []string
		says string
	}{
		"no image":        {[]string{"run", "submit", "--", "true"}, "--image is required"},
		"blank image":     {[]string{"run", "submit", "--image", " "}, "--image is required"},
		"env without =":   {[]string{"run", "submit", "--image", "x", "--env", "FOO"}, `--env "FOO"`},
		"env empty key":   {[]string{"run", "submit", "--image", "x", "--env", "=v"}, `--env "=v"`},
		"bad memory":      {[]string{"run", "submit", "--image", "x", "--memory", "12XB"}, "--memory"},
		"negative memory": {[]string{"run", "submit", "--image", "x", "--memory", "-1MiB"}, "--memory"},
		"empty memory":    {[]string{"run", "submit", "--image", "x", "--memory", ""}, "--memory"},
		"negative cpu":    {[]string{"run", "submit", "--image", "x", "--cpu", "-1", "true"}, "--cpu"},
		"garbage cpu":     {[]string{"run", "submit", "--image", "x", "--cpu", "lots"}, "cpu"},
		"negative retry":  {[]string{"run", "submit", "--image", "x", "--retries", "-1", "true"}, "--retries"},
		"no command":      {[]string{"run", "submit", "--image", "x"}, "the command is required"},
		"empty after --":  {[]string{"run", "submit", "--image", "x", "--"}, "the command is required"},
		"big cpu":         {[]string{"run", "submit", "--image", "x", "--cpu", "5000", "true"}, "--cpu must be a number of cores from 0 (the node's default) to 1024"},
		"small memory":    {[]string{"run", "submit", "--image", "x", "--memory", "1MiB", "true"}, "--memory must be at least 6 MiB"},
		"bad env name":    {[]string{"run", "submit", "--image", "x", "--env", "1X=y", "true"}, `--env: "1X" is not a valid variable name`},
		"gpu model alone": {[]string{"run", "submit", "--image", "x", "--gpu-model", "H100", "true"}, "--gpus: gpu_model and gpu_memory_bytes need gpus of 1 or more"},
		"artifact at /":   {[]string{"run", "submit", "--image", "x", "--artifact", "a:/", "true"}, "artifacts[0].mount_path: must not be /"},
		"host network":    {[]string{"run", "submit", "--image", "x", "--network", "host", "true"}, "--network: only a gang's members"},
		"bad user":        {[]string{"run", "submit", "--image", "x", "--user", "-0", "true"}, `--user: "-0" is not a user`},
		"negative pids":   {[]string{"run", "submit", "--image", "x", "--pids-limit", "-1", "true"}, "--pids-limit must be from 0"},
		"negative time":   {[]string{"run", "submit", "--image", "x", "--timeout", "-1s", "true"}, "--timeout"},
		"zero count":      {[]string{"run", "submit", "--image", "x", "--count", "0", "true"}, "--count must be 1 or more, got 0"},
		"negative count":  {[]string{"run", "submit", "--image", "x", "--count", "-2", "true"}, "--count must be 1 or more"},
		"count and index": {[]string{"run", "submit", "--image", "x", "--count", "2", "--env", "MERCATOR_RUN_INDEX=7", "true"}, "--env MERCATOR_RUN_INDEX cannot be combined with --count"},
		"unknown flag":    {[]string{"run", "submit", "--image", "x", "--tpus", "1"}, "tpus"},
		"bad output":      {[]string{"run", "get", "r-1", "-o", "yaml"}, "table or json"},
		"no run id":       {[]string{"run", "get"}, "RUN_ID"},
		"two run ids":     {[]string{"run", "wait", "r-1", "r-2"}, "RUN_ID"},
		"bad status":      {[]string{"run", "ls", "--status", "running,done"}, `"done"`},
		"negative limit":  {[]string{"run", "ls", "--limit", "-3"}, "--limit"},
		"negative ttl":    {[]string{"node", "invite", "n-1", "--ttl", "-1h"}, "--ttl"},
		"unknown command": {[]string{"frobnicate"}, `unknown command "frobnicate"`},
		"unknown sub":     {[]string{"run", "frobnicate"}, `unknown command "run frobnicate"`},
		"lead's server":   {[]string{"bogus-server"}, "unknown command"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFakeAPI(t)
			res := f.cli(t, tc.args...)
			if res.code != 2 {
				t.Fatalf("exit %d, want 2; stderr %q", res.code, res.stderr)
			}
			if !strings.HasPrefix(res.stderr, "error: ") || !strings.Contains(res.stderr, tc.says) {
				t.Errorf("stderr %q does not say %q", res.stderr, tc.says)
			}
			if res.stdout != "" {
				t.Errorf("stdout = %q, want nothing", res.stdout)
			}
			if n := f.requestCount(); n != 0 {
				t.Errorf("%d requests reached the server", n)
			}
		})
	}
}

func TestServerErrorsExit1WithField(t *testing.T) {
	f := newFakeAPI(t)
	res := f.cli(t, "run", "submit", "--image", "bad", "true")
	if res.code != 1 {
		t.Fatalf("exit %d, want 1", res.code)
	}
	if !strings.HasPrefix(res.stderr, "error: ") || !strings.Contains(res.stderr, "image: ") || !strings.Contains(res.stderr, "cannot resolve") {
		t.Errorf("stderr = %q", res.stderr)
	}
	if res.stdout != "" {
		t.Errorf("stdout = %q", res.stdout)
	}
	res = f.cli(t, "run", "get", "r-404")
	if res.code != 1 || !strings.Contains(res.stderr, "not found") {
		t.Errorf("exit %d, stderr %q", res.code, res.stderr)
	}
}

func TestMissingCredential(t *testing.T) {
	res := runCLI(t, map[string]string{"HOME": t.TempDir()}, "run", "ls")
	if res.code != 1 {
		t.Fatalf("exit %d", res.code)
	}
	for _, hint := range []string{"mercator dev", "MERCATOR_TOKEN", "--token-file"} {
		if !strings.Contains(res.stderr, hint) {
			t.Errorf("stderr %q lacks %q", res.stderr, hint)
		}
	}
}

func TestFlagsBeatEnvironment(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"MERCATOR_ADDR": "http://127.0.0.1:1", "MERCATOR_TOKEN": "wrong", "HOME": dir}
	res := runCLI(t, env, "run", "ls", "--addr", f.srv.URL, "--token-file", tokenFile)
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	// And the context file `mercator dev` writes is found without flags.
	ctxPath := filepath.Join(dir, ".config", "mercator", "context.json")
	if err := client.WriteContext(ctxPath, client.ContextFile{Addr: f.srv.URL, TokenFile: tokenFile}); err != nil {
		t.Fatal(err)
	}
	res = runCLI(t, map[string]string{"HOME": dir}, "run", "ls")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
}

func TestRunWaitExitCodes(t *testing.T) {
	cases := []struct {
		name    string
		status  string
		exit    *int
		reason  string
		code    int
		summary string
	}{
		{"succeeded", api.RunSucceeded, intp(0), "", 0, "run r-1 succeeded (exit 0) in 1.2s\n"},
		{"failed with code", api.RunFailed, intp(3), "exited 3", 3, "run r-1 failed (exit 3) in 1.2s: exited 3\n"},
		{"failed without code", api.RunFailed, nil, "image pull failed", 1, "run r-1 failed in 1.2s: image pull failed\n"},
		{"failed with code 0", api.RunFailed, intp(0), "timed out", 1, "run r-1 failed (exit 0) in 1.2s: timed out\n"},
		{"cancelled", api.RunCancelled, nil, "", 130, "run r-1 cancelled in 1.2s\n"},
		{"cancelled with code", api.RunCancelled, intp(143), "", 143, "run r-1 cancelled (exit 143) in 1.2s\n"},
		{"cancelled with code 0", api.RunCancelled, intp(0), "", 130, "run r-1 cancelled (exit 0) in 1.2s\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			f.addRun(api.Run{ID: "r-1", Status: tc.status, ExitCode: tc.exit, Reason: tc.reason,
				CreatedAt: t0, FinishedAt: timep(1200 * time.Millisecond)})
			res := f.cli(t, "run", "wait", "r-1")
			if res.code != tc.code {
				t.Errorf("exit %d, want %d", res.code, tc.code)
			}
			if res.stderr != tc.summary {
				t.Errorf("stderr = %q, want %q", res.stderr, tc.summary)
			}
			if res.stdout != "" {
				t.Errorf("stdout = %q", res.stdout)
			}
			if r := f.lastRequest(); r.URL.Path != "/v1/runs/r-1/wait" || r.URL.Query().Get("timeout") == "" {
				t.Errorf("last request %s", r.URL)
			}
		})
	}
}

func TestRunWaitInterrupted(t *testing.T) {
	f := newFakeAPI(t)
	f.addRun(api.Run{ID: "r-1", Status: api.RunRunning, CreatedAt: t0})
	var stdout, stderr bytes.Buffer
	env := map[string]string{"MERCATOR_ADDR": f.srv.URL, "MERCATOR_TOKEN": testToken}
	inv := &command.Invocation{Stdout: &stdout, Stderr: &stderr, Env: func(k string) string { return env[k] }, Now: time.Now}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if code := execute(ctx, inv, []string{"run", "wait", "r-1"}); code != 130 {
		t.Errorf("exit %d, want 130", code)
	}
	if !strings.Contains(stderr.String(), "run r-1 goes on") {
		t.Errorf("stderr = %q", stderr.String())
	}
}

func TestRunWaitJSON(t *testing.T) {
	f := newFakeAPI(t)
	f.addRun(api.Run{ID: "r-1", Status: api.RunFailed, ExitCode: intp(7), CreatedAt: t0, FinishedAt: timep(time.Second)})
	res := f.cli(t, "run", "wait", "-o", "json", "r-1")
	if res.code != 7 {
		t.Fatalf("exit %d", res.code)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
		t.Fatalf("stdout %q: %v", res.stdout, err)
	}
	if got["id"] != "r-1" || got["exit_code"] != 7.0 {
		t.Errorf("got %v", got)
	}
}

// jsonKeys decodes a JSON object and returns its keys.
func jsonKeys(t *testing.T, s string) map[string]any {
	t.Helper()
	if !strings.HasPrefix(s, "{\n  \"") {
		t.Errorf("output is not indented JSON: %q", s)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("output %q: %v", s, err)
	}
	return m
}

func hasKeys(t *testing.T, m map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q: %v", k, m)
		}
	}
}

func sampleRun() api.Run {
	return api.Run{ID: "r-7", RunSpec: api.RunSpec{Image: "alpine:3", Command: []string{"false"}},
		PinnedImage: "alpine@sha256:0123", Status: api.RunFailed, Reason: "exited 1", ExitCode: intp(1),
		Attempts: []api.Attempt{{Number: 1, NodeID: "n-1", Status: api.AttemptFailed,
			ContainerID: "0123456789abcdef0123", ExitCode: intp(1), Error: "exit status 1",
			PlacedAt: t0, StartedAt: timep(time.Second), FinishedAt: timep(1500 * time.Millisecond)}},
		CreatedAt: t0, UpdatedAt: t0, FinishedAt: timep(2 * time.Second)}
}

func sampleNode() api.Node {
	return api.Node{ID: "n-1", Status: api.NodeReady, FencingToken: 4, EnrolledAt: timep(-time.Hour),
		LastSeenAt: timep(-3 * time.Second), Running: []string{"r-7/1"},
		Facts: factsp(map[string]any{"hostname": "box", "os": "linux", "arch": "amd64", "cpus": 16.0,
			"memory_bytes": float64(64 << 30), "disk_free_bytes": float64(500 << 30), "runtime_name": "docker",
			"runtime_version": "28.5.2", "runtime_api_version": "1.51", "agent_version": "v0.1.0",
			"capability_version": 1.0, "images": []any{"a@sha256:1", "b@sha256:2"},
			"accelerators": []any{map[string]any{"vendor": "nvidia", "model": "H100", "uuid": "GPU-1", "memory_bytes": float64(80 << 30)}},
			"functions":    map[string]any{"memory_bytes": float64(4 << 30), "milli_cpus": 2500.0, "gpus": []any{"GPU-1"}, "output_relay": true}})}
}

func TestJSONOutputShapes(t *testing.T) {
	f := newFakeAPI(t)
	f.addRun(sampleRun())
	f.nodes["n-1"] = sampleNode()

	res := f.cli(t, "run", "get", "r-7", "-o", "json")
	if res.code != 0 {
		t.Fatalf("run get: %d %s", res.code, res.stderr)
	}
	run := jsonKeys(t, res.stdout)
	hasKeys(t, run, "id", "image", "command", "pinned_image", "status", "reason", "exit_code", "attempts", "created_at", "finished_at")
	att := run["attempts"].([]any)[0].(map[string]any)
	hasKeys(t, att, "number", "node_id", "status", "container_id", "exit_code", "error", "started_at", "finished_at")

	res = f.cli(t, "run", "ls", "--output=json")
	hasKeys(t, jsonKeys(t, res.stdout), "runs")

	res = f.cli(t, "run", "submit", "-o", "json", "--image", "x", "true")
	hasKeys(t, jsonKeys(t, res.stdout), "id", "pinned_image", "status", "attempts")

	res = f.cli(t, "run", "cancel", "r-7", "-o", "json")
	hasKeys(t, jsonKeys(t, res.stdout), "id", "cancel_requested")

	res = f.cli(t, "node", "invite", "n-2", "--ttl", "1h", "-o", "json")
	inv := jsonKeys(t, res.stdout)
	hasKeys(t, inv, "node_id", "token", "expires_at", "command")
	if inv["token"] != "inv-secret" {
		t.Errorf("token = %v", inv["token"])
	}
	if f.invites[0].TTLSeconds != 3600 {
		t.Errorf("ttl_seconds = %d", f.invites[0].TTLSeconds)
	}

	res = f.cli(t, "node", "ls", "-o", "json")
	nodes := jsonKeys(t, res.stdout)["nodes"].([]any)
	hasKeys(t, nodes[0].(map[string]any), "id", "status", "fencing_token", "last_seen_at", "facts", "running")

	res = f.cli(t, "node", "get", "-o", "json", "n-1")
	hasKeys(t, jsonKeys(t, res.stdout)["facts"].(map[string]any), "cpus", "memory_bytes", "runtime_version", "images")

	res = f.cli(t, "version", "-o", "json")
	hasKeys(t, jsonKeys(t, res.stdout), "version", "capability_version", "go", "platform")
}

func TestRunGetTable(t *testing.T) {
	f := newFakeAPI(t)
	f.addRun(sampleRun())
	res := f.cli(t, "run", "get", "r-7")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	for _, want := range []string{"ID:", "r-7", "Status:", "failed", "Reason:", "exited 1", "Image:", "alpine:3",
		"Pinned image:", "alpine@sha256:0123", "Exit code:", "Created:", "2026-12-01T10:00:00.000Z",
		"Finished:", "(after 2s)", "NODE", "CONTAINER", "STARTED", "n-1", "0123456789ab ",
		"2026-12-01T10:00:01.000Z", "2026-12-01T10:00:01.500Z", "exit status 1"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, res.stdout)
		}
	}
}

func TestRunLsTable(t *testing.T) {
	f := newFakeAPI(t)
	f.addRun(sampleRun())
	res := f.cli(t, "run", "ls", "--status", "failed", "--status", "queued,running", "--limit", "5", "--before", "r-9")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	q := f.lastRequest().URL.Query()
	if q.Get("status") != "failed,queued,running" || q.Get("limit") != "5" || q.Get("before") != "r-9" {
		t.Errorf("query = %v", q)
	}
	if !strings.HasPrefix(res.stdout, "ID ") || !strings.Contains(res.stdout, "r-7") {
		t.Errorf("stdout:\n%s", res.stdout)
	}
}

func TestRunLogs(t *testing.T) {
	f := newFakeAPI(t)
	f.addRun(sampleRun())
	f.logs["r-7"] = "line 1\n\x00binary\xffbytes"
	res := f.cli(t, "run", "logs", "r-7", "-f")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	if res.stdout != f.logs["r-7"] {
		t.Errorf("stdout = %q", res.stdout)
	}
	if q := f.lastRequest().URL.Query(); q.Get("follow") != "true" {
		t.Errorf("query = %v", q)
	}
	res = f.cli(t, "run", "logs", "r-7")
	if q := f.lastRequest().URL.Query(); res.code != 0 || q.Get("follow") != "false" {
		t.Errorf("exit %d, query = %v", res.code, q)
	}
}

func TestRunCancel(t *testing.T) {
	f := newFakeAPI(t)
	r := sampleRun()
	r.Status, r.ExitCode, r.FinishedAt = api.RunRunning, nil, nil
	f.addRun(r)
	res := f.cli(t, "run", "cancel", "r-7")
	if res.code != 0 || !strings.Contains(res.stdout, "cancel requested") {
		t.Errorf("exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	if req := f.lastRequest(); req.Method != "POST" || req.URL.Path != "/v1/runs/r-7/cancel" {
		t.Errorf("request %s %s", req.Method, req.URL.Path)
	}
}

func TestNodeTables(t *testing.T) {
	f := newFakeAPI(t)
	f.nodes["n-1"] = sampleNode()
	f.nodes["n-2"] = api.Node{ID: "n-2", Status: api.NodeInvited}
	res := f.cli(t, "node", "get", "n-1")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	for _, want := range []string{"Fencing token:", "4", "CPUs:", "16", "Memory:", "64.0 GiB", "Disk free:", "500.0 GiB",
		"Runtime:", "docker 28.5.2 (API 1.51)", "Images:", "2", "Last seen:", "(3s ago)", "nvidia H100, 80.0 GiB, GPU-1",
		"Running:", "r-7/1", "Functions:", "4.0 GiB memory, 2.5 CPUs, 1 GPU; output through the agent's relay"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("node get lacks %q:\n%s", want, res.stdout)
		}
	}
	// The functions share without the relay, and a node without functions.
	daemonOut, noFns := sampleNode(), sampleNode()
	daemonOut.ID, noFns.ID = "n-4", "n-5"
	(*daemonOut.Facts)["functions"] = map[string]any{"memory_bytes": float64(1 << 30), "milli_cpus": 500.0}
	delete(*noFns.Facts, "functions")
	f.nodes["n-4"], f.nodes["n-5"] = daemonOut, noFns
	for id, want := range map[string]string{"n-4": "1.0 GiB memory, 0.5 CPUs; output through the Docker daemon", "n-5": "none (the agent runs no functions)"} {
		if res := f.cli(t, "node", "get", id); res.code != 0 || !strings.Contains(res.stdout, want) {
			t.Errorf("node get %s: exit %d, want %q:\n%s", id, res.code, want, res.stdout)
		}
	}
	res = f.cli(t, "node", "get", "n-2")
	if res.code != 0 || !strings.Contains(res.stdout, "none reported yet") {
		t.Errorf("exit %d:\n%s", res.code, res.stdout)
	}
	res = f.cli(t, "node", "ls")
	if res.code != 0 || !strings.Contains(res.stdout, "n-1") || !strings.Contains(res.stdout, "n-2") || !strings.Contains(res.stdout, "never") {
		t.Errorf("exit %d:\n%s", res.code, res.stdout)
	}
	res = f.cli(t, "node", "invite", "n-3")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	for _, want := range []string{"Token: inv-secret", "mercator agent --server", "--invitation inv-secret", "in 24h0m"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("node invite lacks %q:\n%s", want, res.stdout)
		}
	}
	if f.invites[0].TTLSeconds != 0 {
		t.Errorf("default ttl sent as %d", f.invites[0].TTLSeconds)
	}
}

func TestHelp(t *testing.T) {
	res := runCLI(t, nil, "help")
	if res.code != 0 {
		t.Fatalf("exit %d", res.code)
	}
	var leaves []string
	for _, name := range command.SortedKeys(commands) {
		c := commands[name]
		if c.Subs == nil {
			leaves = append(leaves, name)
		}
		for _, sub := range command.SortedKeys(c.Subs) {
			leaves = append(leaves, name+" "+sub)
		}
	}
	for _, leaf := range leaves {
		if !strings.Contains(res.stdout, "  "+leaf+" ") {
			t.Errorf("help does not list %q:\n%s", leaf, res.stdout)
		}
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"run", "--help"}, {"run", "help"}, {"help", "run"}} {
		if res := runCLI(t, nil, args...); res.code != 0 || !strings.Contains(res.stdout, "run submit") {
			t.Errorf("%q: exit %d, stdout %q", args, res.code, res.stdout)
		}
	}
	res = runCLI(t, nil, "help", "run", "wait")
	if res.code != 0 || !strings.Contains(res.stdout, "130") || !strings.Contains(res.stdout, "-o, --output") {
		t.Errorf("run wait help: exit %d\n%s", res.code, res.stdout)
	}
	res = runCLI(t, nil, "run", "submit", "-h")
	if res.code != 0 || !strings.Contains(res.stdout, "--memory") {
		t.Errorf("run submit -h: exit %d\n%s", res.code, res.stdout)
	}
	for _, args := range [][]string{{}, {"run"}, {"node"}} {
		if res := runCLI(t, nil, args...); res.code != 2 || !strings.Contains(res.stderr, "Commands:") {
			t.Errorf("%q: exit %d, stderr %q", args, res.code, res.stderr)
		}
	}
}

func TestVersion(t *testing.T) {
	res := runCLI(t, nil, "version")
	if res.code != 0 || !strings.HasPrefix(res.stdout, "mercator ") {
		t.Errorf("exit %d, stdout %q", res.code, res.stdout)
	}
}

func TestRegisterRejectsDuplicates(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("registering run twice did not panic")
		}
	}()
	register(&command.Command{Name: "run"})
}
