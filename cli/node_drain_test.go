package cli

import (
	"bytes"
	"testing"

	"github.com/mercator/mercator/api"
)

// TestDrainProgressLines: one line per change of what is left on the
// node, function containers counted from its facts in every state.
func TestDrainProgressLines(t *testing.T) {
	var out bytes.Buffer
	p := &drainProgress{w: &out}
	facts := api.NodeFactsDoc{"functions": map[string]any{"containers": []any{
		map[string]any{"fn_id": "f1", "idle": 1, "busy": 1}, map[string]any{"fn_id": "f2", "starting": 1, "prepared": 1}}}}
	for _, n := range []api.Node{
		{ID: "gpu-7", Draining: true, Running: []string{"r-1/1", "r-2/1"}, Facts: &facts},
		{ID: "gpu-7", Draining: true, Running: []string{"r-1/1", "r-2/1"}, Facts: &facts},
		{ID: "gpu-7", Draining: true, Running: []string{"r-2/1"}, Facts: &facts},
		{ID: "gpu-7", Draining: true},
	} {
		p.observe(n)
	}
	want := `node gpu-7 draining: 2 runs and 4 function containers left
node gpu-7 draining: 1 runs and 4 function containers left
node gpu-7 draining: 0 runs and 0 function containers left
`
	if out.String() != want {
		t.Fatalf("progress:\n%s\nwant:\n%s", out.String(), want)
	}
}
