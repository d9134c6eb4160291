package e2e

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/failure"
)

func (c *cluster) submit(spec api.RunSpec) api.Run {
	c.t.Helper()
	if spec.Image == "" {
		spec.Image = c.workload
	}
	run, err := c.client.SubmitRun(c.ctx, spec)
	if err != nil {
		c.t.Fatalf("submit %+v: %v", spec, err)
	}
	return run
}

func (c *cluster) wait(id string) api.Run {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	run, err := c.client.WaitRun(ctx, id)
	if err != nil {
		c.t.Fatalf("wait %s: %v", id, err)
	}
	return run
}

func (c *cluster) logs(id string) string {
	c.t.Helper()
	var buf bytes.Buffer
	if err := c.client.Logs(c.ctx, id, false, &buf); err != nil {
		c.t.Fatalf("logs %s: %v", id, err)
	}
	return buf.String()
}

func TestRunLifecycle(t *testing.T) {
	c := startCluster(t)
	c.startAgent("n")

	t.Run("success with logs and the daemon's moments", func(t *testing.T) {
		run := c.submit(api.RunSpec{Command: []string{"lines", "3"}, CPU: 0.5, MemoryBytes: 64 << 20})
		if !strings.Contains(run.PinnedImage, "@sha256:") {
			t.Fatalf("pinned image %q is not a digest reference", run.PinnedImage)
		}
		done := c.wait(run.ID)
		if done.Status != api.RunSucceeded || done.ExitCode == nil || *done.ExitCode != 0 {
			t.Fatalf("run = %s exit %v reason %q", done.Status, done.ExitCode, done.Reason)
		}
		if len(done.Attempts) != 1 {
			t.Fatalf("attempts = %+v", done.Attempts)
		}
		a := done.Attempts[0]
		// The moments are the daemon's, reported as it states them. Docker
		// stamps StartedAt after the start call returns, so for a process
		// that exits within a millisecond FinishedAt can precede StartedAt
		// slightly; Mercator does not "correct" the daemon.
		if a.StartedAt == nil || a.FinishedAt == nil || a.FinishedAt.Before(a.StartedAt.Add(-100*time.Millisecond)) || a.ContainerID == "" || a.NodeID == "" {
			t.Fatalf("attempt lacks the daemon's facts: %+v", a)
		}
		logs := c.logs(run.ID)
		for _, want := range []string{"line 1", "line 3", "stderr line"} {
			if !strings.Contains(logs, want) {
				t.Errorf("logs %q lack %q", logs, want)
			}
		}
		if n := containersFor(t, run.ID); n != 1 {
			t.Errorf("%d containers for the run, want 1", n)
		}
	})

	t.Run("non-zero exit", func(t *testing.T) {
		done := c.wait(c.submit(api.RunSpec{Command: []string{"exit", "3"}}).ID)
		if done.Status != api.RunFailed || done.ExitCode == nil || *done.ExitCode != 3 || !strings.Contains(done.Reason, "exited with code 3") {
			t.Fatalf("run = %s exit %v reason %q", done.Status, done.ExitCode, done.Reason)
		}
	})

	t.Run("retries then fails", func(t *testing.T) {
		done := c.wait(c.submit(api.RunSpec{Command: []string{"exit", "2"}, Retries: 1}).ID)
		if done.Status != api.RunFailed || len(done.Attempts) != 2 {
			t.Fatalf("run = %s with %d attempts, want failed after 2", done.Status, len(done.Attempts))
		}
	})

	t.Run("env reaches the container", func(t *testing.T) {
		run := c.submit(api.RunSpec{Command: []string{"env", "GREETING"}, Env: map[string]string{"GREETING": "bonjour"}})
		if done := c.wait(run.ID); done.Status != api.RunSucceeded {
			t.Fatalf("status %s: %s", done.Status, done.Reason)
		}
		if logs := c.logs(run.ID); !strings.Contains(logs, "bonjour") {
			t.Fatalf("logs %q", logs)
		}
	})

	t.Run("a sweep: run submit --count", func(t *testing.T) {
		// One batch call through the CLI; each copy runs in its own
		// container and sees its own index.
		out := c.mercator("run", "submit", "--image", c.workload, "--count", "3", "--", "env", "MERCATOR_RUN_INDEX")
		ids := strings.Fields(out)
		if len(ids) != 3 {
			t.Fatalf("run submit --count 3 printed %q, want three run IDs", out)
		}
		seen := map[string]bool{}
		for _, id := range ids {
			if done := c.wait(id); done.Status != api.RunSucceeded {
				t.Fatalf("run %s: %s (%s)", id, done.Status, done.Reason)
			}
			seen[strings.TrimSpace(c.logs(id))] = true // the workload prints the value alone
			if n := containersFor(t, id); n != 1 {
				t.Errorf("%d containers for run %s, want 1", n, id)
			}
		}
		if !seen["0"] || !seen["1"] || !seen["2"] || len(seen) != 3 {
			t.Fatalf("indexes seen in the runs' output: %v, want 0, 1 and 2", seen)
		}
	})

	t.Run("cancel a running run", func(t *testing.T) {
		run := c.submit(api.RunSpec{Command: []string{"sleep", "300"}})
		c.waitFor("running", func() bool {
			r, err := c.client.GetRun(c.ctx, run.ID)
			return err == nil && r.Status == api.RunRunning
		})
		if _, err := c.client.CancelRun(c.ctx, run.ID); err != nil {
			t.Fatal(err)
		}
		done := c.wait(run.ID)
		if done.Status != api.RunCancelled || done.Attempts[0].FinishedAt == nil {
			t.Fatalf("run = %s %+v", done.Status, done.Attempts)
		}
	})

	t.Run("cancel a queued run", func(t *testing.T) {
		// 1000 CPUs fit no node, so the run stays queued.
		run := c.submit(api.RunSpec{Command: []string{"echo"}, CPU: 1000})
		c.waitFor("a waiting reason", func() bool {
			r, _ := c.client.GetRun(c.ctx, run.ID)
			return strings.Contains(r.Reason, "fewer CPUs than requested")
		})
		done, err := c.client.CancelRun(c.ctx, run.ID)
		if err != nil || done.Status != api.RunCancelled {
			t.Fatalf("cancel: %v %+v", err, done)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		done := c.wait(c.submit(api.RunSpec{Command: []string{"ignore-term", "300"}, TimeoutSeconds: 1}).ID)
		if done.Status != api.RunFailed || !strings.Contains(done.Reason, "timed out") || done.Attempts[0].StopReason != "timeout" {
			t.Fatalf("run = %s reason %q attempt %+v", done.Status, done.Reason, done.Attempts[0])
		}
	})

	t.Run("digest the registry lacks", func(t *testing.T) {
		ref := c.registry + "/workload@sha256:" + strings.Repeat("ab", 32)
		_, err := c.client.SubmitRun(c.ctx, api.RunSpec{Image: ref, Command: []string{"echo"}})
		expectInvalid(t, err, "image")
	})

	t.Run("tag that does not exist", func(t *testing.T) {
		_, err := c.client.SubmitRun(c.ctx, api.RunSpec{Image: c.registry + "/workload:no-such-tag", Command: []string{"echo"}})
		expectInvalid(t, err, "image")
	})
}

func TestMissingCommandFailsClearly(t *testing.T) {
	c := startCluster(t)
	c.startAgent("n")
	done := c.wait(c.submit(api.RunSpec{Image: c.workload, Command: []string{"echo"}}).ID)
	if done.Status != api.RunSucceeded {
		t.Fatalf("baseline run %s: %s", done.Status, done.Reason)
	}
	// The workload image's ENTRYPOINT is /workload, so a missing program
	// needs an image without one: hello has none.
	hello := c.publish("hello")
	done = c.wait(c.submit(api.RunSpec{Image: hello, Command: []string{"/no/such/program"}}).ID)
	if done.Status != api.RunFailed || !strings.Contains(done.Reason, "/no/such/program") {
		t.Fatalf("run = %s reason %q", done.Status, done.Reason)
	}
}

func expectInvalid(t *testing.T, err error, field string) {
	t.Helper()
	var fe *failure.Error
	if !errors.Is(err, failure.ErrInvalid) || !errors.As(err, &fe) || fe.Field != field {
		t.Fatalf("error = %v, want invalid %s", err, field)
	}
}

func TestBadInputCreatesNothing(t *testing.T) {
	c := startCluster(t)
	post := func(body string, token string) (int, api.Error) {
		req, _ := http.NewRequest("POST", c.url+"/v1/runs", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e api.Error
		decodeJSON(t, resp, &e)
		return resp.StatusCode, e
	}
	img := c.workload
	cases := []struct {
		name, body, field string
	}{
		{"malformed JSON", `{"image":`, ""},
		{"unknown field", `{"image":"` + img + `","command":["echo"],"gpu":1}`, "gpu"},
		{"wrong type", `{"image":"` + img + `","command":"echo"}`, "command"},
		{"invalid image", `{"image":"UPPER CASE!","command":["echo"]}`, "image"},
		{"empty image", `{"image":"","command":["echo"]}`, "image"},
		{"empty command", `{"image":"` + img + `","command":[]}`, "command"},
		{"negative cpu", `{"image":"` + img + `","command":["echo"],"cpu":-1}`, "cpu"},
		{"absurd cpu", `{"image":"` + img + `","command":["echo"],"cpu":1e9}`, "cpu"},
		{"negative memory", `{"image":"` + img + `","command":["echo"],"memory_bytes":-5}`, "memory_bytes"},
		{"tiny memory", `{"image":"` + img + `","command":["echo"],"memory_bytes":1000}`, "memory_bytes"},
		{"negative timeout", `{"image":"` + img + `","command":["echo"],"timeout_seconds":-1}`, "timeout_seconds"},
		{"bad env name", `{"image":"` + img + `","command":["echo"],"env":{"1X":"y"}}`, "env"},
		{"two objects", `{"image":"` + img + `","command":["echo"]}{}`, ""},
	}
	for _, tc := range cases {
		status, e := post(tc.body, c.token)
		if status != http.StatusBadRequest || e.Error.Code != "invalid" || e.Error.Field != tc.field || e.Error.Message == "" {
			t.Errorf("%s: status %d error %+v, want 400 invalid on %q", tc.name, status, e.Error, tc.field)
		}
	}
	if status, e := post(`{"image":"`+img+`","command":["echo"]}`, "wrong"); status != http.StatusUnauthorized || e.Error.Code != "unauthorized" {
		t.Errorf("wrong credential: %d %+v", status, e)
	}
	req, _ := http.NewRequest("GET", c.url+"/v1/runs", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("missing credential: status %d", resp.StatusCode)
	}
	list, err := c.client.ListRuns(c.ctx, client.ListRunsOptions{})
	if err != nil || len(list.Runs) != 0 {
		t.Fatalf("runs after bad input: %v %+v", err, list.Runs)
	}
	if _, err := c.client.GetRun(c.ctx, "r-nosuchrun"); !errors.Is(err, failure.ErrNotFound) {
		t.Fatalf("unknown run: %v", err)
	}
	if _, err := c.client.InviteNode(c.ctx, "Bad Node!", 0); !errors.Is(err, failure.ErrInvalid) {
		t.Fatalf("bad node ID: %v", err)
	}
}

func TestInvitationIsSingleUse(t *testing.T) {
	c := startCluster(t)
	inv, err := c.client.InviteNode(c.ctx, "once", 0)
	if err != nil {
		t.Fatal(err)
	}
	enroll := func() (int, api.Error) {
		body := `{"node_id":"once","invitation":"` + inv.Token + `","agent_version":"test","capability_version":1}`
		resp, err := http.Post(c.url+"/v1/node/enroll", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e api.Error
		decodeJSON(t, resp, &e)
		return resp.StatusCode, e
	}
	if status, _ := enroll(); status != http.StatusOK {
		t.Fatalf("first enrollment: %d", status)
	}
	status, e := enroll()
	if status != http.StatusUnauthorized || !strings.Contains(e.Error.Message, "already used") {
		t.Fatalf("second enrollment: %d %+v", status, e)
	}
}
