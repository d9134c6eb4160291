package cli

import (
	"bytes"
	"testing"

	"github.com/mercator/mercator/api"
)

// TestRunProgressLines: each new stage, or a new reason to wait, is one
// line; a repeated state prints nothing, and the end is left to the
// summary.
func TestRunProgressLines(t *testing.T) {
	var out bytes.Buffer
	p := &runProgress{w: &out}
	onNode := []api.Attempt{{Number: 1, NodeID: "gpu-7"}}
	for _, r := range []api.Run{
		{ID: "r-1", Status: api.RunQueued, Reason: "no node has a free GPU (3 nodes: 3 have no free GPU)"},
		{ID: "r-1", Status: api.RunQueued, Reason: "no node has a free GPU (3 nodes: 3 have no free GPU)"},
		{ID: "r-1", Status: api.RunQueued, Reason: "no node has a free GPU (4 nodes: 4 have no free GPU)"},
		{ID: "r-1", Status: api.RunPlaced, Attempts: onNode},
		{ID: "r-1", Status: api.RunPreparing, Attempts: onNode, RunSpec: api.RunSpec{Artifacts: []api.ArtifactMount{{Name: "weights"}}}},
		{ID: "r-1", Status: api.RunPreparing, Attempts: []api.Attempt{{NodeID: "gpu-7", Progress: &api.PrepareProgress{Step: "image", DoneBytes: 50 << 20, TotalBytes: 200 << 20}}}},
		{ID: "r-1", Status: api.RunPreparing, Attempts: []api.Attempt{{NodeID: "gpu-7", Progress: &api.PrepareProgress{Step: "artifacts", TotalBytes: 3 << 30}}}},
		{ID: "r-1", Status: api.RunRunning, Attempts: onNode},
		{ID: "r-1", Status: api.RunSucceeded, Attempts: onNode},
	} {
		p.observe(r)
	}
	want := `run r-1 queued: no node has a free GPU (3 nodes: 3 have no free GPU)
run r-1 queued: no node has a free GPU (4 nodes: 4 have no free GPU)
run r-1 placed on node gpu-7
run r-1 preparing on node gpu-7: pulling the image, copying 1 Artifact(s)
run r-1 preparing on node gpu-7: pulling the image: 25% (50.0 MiB of 200.0 MiB)
run r-1 preparing on node gpu-7: copying the Artifacts (3.0 GiB)
run r-1 running on node gpu-7
`
	if out.String() != want {
		t.Fatalf("progress:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestRunSubmitWait: --wait prints the ID, waits, and exits with the run's
// status; with --count it is refused.
func TestRunSubmitWait(t *testing.T) {
	f := newFakeAPI(t)
	f.onCreate = func(r api.Run) api.Run {
		r.Status, r.ExitCode, r.FinishedAt = api.RunFailed, intp(3), timep(2e9)
		return r
	}
	res := f.cli(t, "run", "submit", "--image", "alpine", "--wait", "--", "false")
	if res.code != 3 || res.stdout != "r-1\n" || res.stderr != "run r-1 failed (exit 3) in 2s\n" {
		t.Fatalf("submit --wait: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	if r := f.lastRequest(); r.URL.Path != "/v1/runs/r-1/wait" {
		t.Fatalf("last request %s", r.URL)
	}
	if res := f.cli(t, "run", "submit", "--image", "alpine", "--wait", "--count", "2", "--", "true"); res.code != 2 {
		t.Fatalf("--wait --count: exit %d, stderr %q", res.code, res.stderr)
	}
}
