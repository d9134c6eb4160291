package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
)

// TestProjectCommands drives `mercator project …` and a run's --project
// against a real control plane: create with every flag, update keeping
// what is not given, a bad --gpus as a usage error, a run submitted to
// the context's default project ($MERCATOR_PROJECT) and listed by it, and
// rm refused while that run is unfinished.
func TestProjectCommands(t *testing.T) {
	env, admin := startControlPlane(t, t.TempDir())
	mercator := func(args ...string) result {
		t.Helper()
		return runCLI(t, env, append(args, "--token-file", admin)...)
	}
	ok := func(args ...string) string {
		t.Helper()
		res := mercator(args...)
		if res.code != 0 {
			t.Fatalf("mercator %s: exit %d, %s", strings.Join(args, " "), res.code, res.stderr)
		}
		return res.stdout
	}
	res := mercator("project", "create", "vision", "--gpus", "H100=16,A100=8", "--cpu", "256", "--memory", "2TiB",
		"--max-running", "40", "--weight", "2", "--pools", "secure,gpu")
	if res.code != 0 || !strings.Contains(res.stderr, "quota A100=8,H100=16,cpu=256,memory=2.0 TiB, max running 40, weight 2, pools secure,gpu") {
		t.Fatalf("create: exit %d, %s", res.code, res.stderr)
	}
	if res := mercator("project", "create", "nlp", "--gpus", "H100"); res.code != 2 || !strings.Contains(res.stderr, "MODEL=N") {
		t.Errorf("bad --gpus: exit %d, %s", res.code, res.stderr)
	}
	ok("project", "update", "vision", "--weight", "3")
	var p api.Project
	if err := json.Unmarshal([]byte(ok("project", "get", "vision", "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	if p.Weight != 3 || p.Quota.GPUs["H100"] != 16 || p.MaxRunning != 40 || len(p.Pools) != 2 {
		t.Errorf("after update --weight 3: %+v, want the rest kept", p)
	}
	if ls := ok("project", "ls"); !strings.Contains(ls, "default") || !strings.Contains(ls, "vision") {
		t.Errorf("project ls:\n%s", ls)
	}

	env["MERCATOR_PROJECT"] = "vision"
	sub := runCLI(t, env, "run", "submit", "--token-file", admin, "--image", "127.0.0.1:5000/hello:1", "--priority", "100", "--", "/hello")
	id := strings.TrimSpace(sub.stdout)
	if sub.code != 0 {
		t.Fatalf("run submit: exit %d, %s", sub.code, sub.stderr)
	}
	var listed api.RunList
	if err := json.Unmarshal([]byte(ok("run", "ls", "-o", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed.Runs) != 1 || listed.Runs[0].ID != id || listed.Runs[0].Project != "vision" || listed.Runs[0].Priority != 100 {
		t.Errorf("vision's runs = %+v, want %s at priority 100", listed.Runs, id)
	}
	if err := json.Unmarshal([]byte(ok("run", "ls", "--project", "default", "-o", "json")), &listed); err != nil || len(listed.Runs) != 0 {
		t.Errorf("default's runs = %+v (%v), want none", listed.Runs, err)
	}
	if res := mercator("project", "rm", "vision"); res.code != 1 || !strings.Contains(res.stderr, id) {
		t.Errorf("rm with an unfinished run: exit %d, %s", res.code, res.stderr)
	}
	ok("run", "cancel", id)
	ok("project", "rm", "vision")

	// Constraints travel with the run; labels are checked before a call.
	delete(env, "MERCATOR_PROJECT")
	sub = runCLI(t, env, "run", "submit", "--token-file", admin, "--image", "127.0.0.1:5000/hello:1", "--constraint", "pool=secure", "--grace", "30s", "--", "/hello")
	var run api.Run
	if err := json.Unmarshal([]byte(ok("run", "get", strings.TrimSpace(sub.stdout), "-o", "json")), &run); err != nil ||
		run.Constraints["pool"] != "secure" || run.GraceSeconds != 30 || run.Project != api.DefaultProject {
		t.Errorf("constrained run: %+v (%v)", run.RunSpec, err)
	}
	if res := mercator("node", "label", "n1", "pool"); res.code != 2 || !strings.Contains(res.stderr, "KEY=VALUE") {
		t.Errorf("node label without =: exit %d, %s", res.code, res.stderr)
	}
	if res := mercator("node", "label", "n1", "pool=a b"); res.code != 2 {
		t.Errorf("node label with a space: exit %d, %s", res.code, res.stderr)
	}
}

// TestRunGetShowsProjectQueueAndPreemption: run get prints the run's
// project and priority, a queued run's position, and a preempted attempt's
// who and why in place of an error.
func TestRunGetShowsProjectQueueAndPreemption(t *testing.T) {
	f := newFakeAPI(t)
	r := sampleRun()
	r.Status, r.Project, r.Priority = api.RunQueued, "vision", 100
	r.Queue = &api.QueuePosition{Project: "vision", Position: 2, Of: 5, Ahead: []string{"r-1"}}
	r.Attempts[0].Status, r.Attempts[0].Error = api.AttemptPreempted, ""
	r.Attempts[0].PreemptedBy = "preempted by r-9 (priority 500) to reclaim project nlp's quota"
	f.addRun(r)
	res := f.cli(t, "run", "get", "r-7")
	for _, want := range []string{"vision (priority 100)", "2 of 5 in vision; ahead: r-1", "preempted by r-9 (priority 500) to reclaim project nlp's quota"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("run get lacks %q:\n%s", want, res.stdout)
		}
	}
}
