package dockerengine

import (
	"math"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
)

func TestContainmentCheck(t *testing.T) {
	if err := DefaultContainment().Check(); err != nil {
		t.Fatalf("DefaultContainment().Check() = %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*Containment)
		says   string
	}{
		{"no default limits", func(c *Containment) { c.DefaultCPU, c.DefaultMemoryBytes = 0, 0 }, ""},
		{"negative CPU", func(c *Containment) { c.DefaultCPU = -1 }, "not a number of cores"},
		{"NaN CPU", func(c *Containment) { c.DefaultCPU = math.NaN() }, "not a number of cores"},
		{"tiny memory", func(c *Containment) { c.DefaultMemoryBytes = 1 << 20 }, "at least 6 MiB"},
		{"no pids limit", func(c *Containment) { c.PidsLimit = 0 }, "must be positive"},
		{"maximum below the default", func(c *Containment) { c.MaxPidsLimit = c.PidsLimit - 1 }, "below the default"},
		{"tiny log", func(c *Containment) { c.LogMaxBytes = 1024 }, "at least 1 MiB"},
	} {
		c := DefaultContainment()
		tc.change(&c)
		err := c.Check()
		if (tc.says == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.says)) {
			t.Errorf("%s: Check() = %v, want %q", tc.name, err, tc.says)
		}
	}
}

// TestApplyReplacesWhatWasWidened: Apply is the last word on the fields it
// owns, so nothing set before it can leave a container privileged or with
// an added capability.
func TestApplyReplacesWhatWasWidened(t *testing.T) {
	c := DefaultContainment()
	hc := &container.HostConfig{Privileged: true, CapAdd: []string{"SYS_ADMIN"}, SecurityOpt: []string{"seccomp=unconfined"}}
	c.Apply(hc, 0)
	if hc.Privileged || hc.CapAdd != nil || len(hc.SecurityOpt) != 1 || hc.SecurityOpt[0] != NoNewPrivileges {
		t.Errorf("after Apply: Privileged %v, CapAdd %v, SecurityOpt %v", hc.Privileged, hc.CapAdd, hc.SecurityOpt)
	}
	if hc.PidsLimit == nil || *hc.PidsLimit != c.PidsLimit {
		t.Errorf("PidsLimit = %v, want the node's %d", hc.PidsLimit, c.PidsLimit)
	}
	c.Apply(hc, 77)
	if *hc.PidsLimit != 77 {
		t.Errorf("PidsLimit = %d, want the 77 asked for", *hc.PidsLimit)
	}
	// The slice is the container's own: changing it leaves the list alone.
	hc.CapDrop[0] = "CHANGED"
	if DroppedCapabilities[0] == "CHANGED" {
		t.Error("Apply shared DroppedCapabilities with the host config")
	}
	if got := c.RunLogConfig(); got.Type != "json-file" || got.Config["max-file"] != "4" || got.Config["max-size"] != "67108864" {
		t.Errorf("RunLogConfig = %+v, want json-file in 4 files of 64 MiB", got)
	}
}
