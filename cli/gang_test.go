package cli

import (
	"reflect"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
)

// TestSubmitGang: --nodes, --gpus, --master-port and --network host reach
// the spec; the host's network without a gang, or a gang past the limit,
// is a usage error naming the flag, and nothing is sent.
func TestSubmitGang(t *testing.T) {
	f := newFakeAPI(t)
	res := f.cli(t, "run", "submit", "--image", "alpine:3", "--nodes", "2", "--gpus", "8", "--master-port", "29501",
		"--network", "host", "--", "true")
	if res.code != 0 {
		t.Fatalf("exit %d, stderr %q", res.code, res.stderr)
	}
	want := api.RunSpec{Image: "alpine:3", Command: []string{"true"}, Nodes: 2, GPUs: 8, MasterPort: 29501, Network: api.NetworkHost}
	if !reflect.DeepEqual(f.submits[0], want) {
		t.Errorf("submitted %+v\nwant %+v", f.submits[0], want)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--network", "host"}, "--network: only a gang's members"},
		{[]string{"--nodes", "65"}, "--nodes must be from 1 to 64"},
	} {
		res := f.cli(t, append(append([]string{"run", "submit", "--image", "alpine:3"}, c.args...), "--", "true")...)
		if res.code != 2 || !strings.Contains(res.stderr, c.want) {
			t.Errorf("run submit %v: exit %d, stderr %q; want 2 and %q", c.args, res.code, res.stderr, c.want)
		}
	}
	if len(f.submits) != 1 {
		t.Errorf("%d submissions, want only the valid one", len(f.submits))
	}
}

// TestRunGetShowsMembers: a gang's latest set is listed by rank with its
// nodes and GPUs, and each attempt says its set and rank.
func TestRunGetShowsMembers(t *testing.T) {
	r := api.Run{ID: "r-1", RunSpec: api.RunSpec{Nodes: 2, GPUs: 1}, Status: api.RunRunning, Attempts: []api.Attempt{
		{Number: 1, NodeID: "n1", GPUs: []string{"GPU-a"}, Status: api.AttemptFailed, Set: 1},
		{Number: 2, NodeID: "n2", GPUs: []string{"GPU-b"}, Status: api.AttemptFailed, Set: 1, Rank: 1},
		{Number: 3, NodeID: "n2", GPUs: []string{"GPU-b"}, Status: api.AttemptRunning, Set: 2},
		{Number: 4, NodeID: "n1", GPUs: []string{"GPU-a"}, Status: api.AttemptRunning, Set: 2, Rank: 1},
	}}
	f := newFakeAPI(t)
	f.runs["r-1"] = r
	res := f.cli(t, "run", "get", "r-1")
	if res.code != 0 {
		t.Fatalf("exit %d, stderr %q", res.code, res.stderr)
	}
	for _, want := range []string{"Members (gang of 2, attempt set 2)", "0     3        n2    1     running", "1     4        n1    1     running", "2 (set 1, rank 1)"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("run get does not show %q:\n%s", want, res.stdout)
		}
	}
}
