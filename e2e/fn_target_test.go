package e2e

import (
	"encoding/json"
	"testing"

	"github.com/mercator/mercator/api"
)

// TestFunctionTargetConcurrency: four concurrent calls of a function whose
// target concurrency is 2 (the Fn API annotation, through the control
// plane to the agent's engine) are served by two containers, each call
// beyond two a container waiting for a busy one instead of starting
// another; each container still serves one call at a time.
func TestFunctionTargetConcurrency(t *testing.T) {
	c := startCluster(t)
	c.startAgent("target")
	_, fn := c.deployHello("target", api.Fn{Name: "raw", Image: c.publish("fn-raw"), IdleTimeout: 60,
		Annotations: api.Annotations{api.AnnotationTargetConcurrency: json.RawMessage(`"2"`)}})
	slowCallsAtOnce(t, c, fn.ID, 4)
	if got := fnContainers(t, fn.ID); len(got) != 2 {
		t.Errorf("containers after 4 concurrent calls at target concurrency 2: %d, want 2", len(got))
	}
}
