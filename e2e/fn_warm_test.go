package e2e

import (
	"encoding/json"
	"testing"

	"github.com/mercator/mercator/api"
)

// TestFunctionWarmCapacity: a function deployed with a minimum has its
// containers started on the agent before any call, serves its first call
// from one of them (none is started for it), and, its minimum set to 0,
// scales to zero after its idle timeout (the scale-down window).
func TestFunctionWarmCapacity(t *testing.T) {
	c := startCluster(t)
	c.startAgent("warm")
	_, fn := c.deployHello("warm", api.Fn{Image: c.publish("fn-hello"), IdleTimeout: 1,
		Annotations: api.Annotations{api.AnnotationMinHot: json.RawMessage(`2`)}})
	c.waitFor("the two held containers started before any call", func() bool { return len(fnContainers(t, fn.ID)) == 2 })
	if status, body := c.invoke(fn.ID, `{"name":"warm"}`); status != 200 {
		t.Fatalf("first call = %d %q", status, body)
	}
	if got := fnContainers(t, fn.ID); len(got) != 2 {
		t.Errorf("containers after the first call: %d, want the 2 held (none started for it)", len(got))
	}
	if _, err := c.client.UpdateFn(c.ctx, fn.ID, api.Fn{Annotations: api.Annotations{api.AnnotationMinHot: json.RawMessage(`0`)}}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("scale to zero after the idle timeout", func() bool { return len(fnContainers(t, fn.ID)) == 0 })
}
