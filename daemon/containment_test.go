package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mercator/mercator/dockerengine"
)

// TestAgentRefusesContainmentItCannotApply: an agent whose containment
// cannot be applied (no process limit, a maximum below the default) stops
// before it contacts anything, saying which figure is wrong, and writes
// nothing but its state directory.
func TestAgentRefusesContainmentItCannotApply(t *testing.T) {
	for name, change := range map[string]func(*dockerengine.Containment){
		"must be positive":  func(c *dockerengine.Containment) { c.PidsLimit = 0 },
		"below the default": func(c *dockerengine.Containment) { c.MaxPidsLimit = c.PidsLimit - 1 },
	} {
		c := dockerengine.DefaultContainment()
		change(&c)
		state := t.TempDir()
		err := RunAgent(context.Background(), AgentOptions{ControlPlaneURL: "https://192.0.2.1:1", NodeID: "n", StateDir: state, Containment: &c})
		if err == nil || !strings.Contains(err.Error(), "containment") || !strings.Contains(err.Error(), name) {
			t.Errorf("RunAgent with %+v = %v, want a containment error saying %q", c, err, name)
		}
		if entries, _ := os.ReadDir(state); len(entries) != 0 {
			t.Errorf("state directory holds %d entries after the refusal (first %s)", len(entries), filepath.Join(state, entries[0].Name()))
		}
	}
}
