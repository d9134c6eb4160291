package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
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
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			res, err := c.client.Invoke(c.ctx, fn.ID, strings.NewReader("x"), http.Header{"X-Test": {"sleep:1500"}}, &out)
			if err == nil && res.Status != 200 {
				err = fmt.Errorf("status %d: %s", res.Status, out.String())
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a call of the function: %v", err)
		}
	}
	if got := fnContainers(t, fn.ID); len(got) != 2 {
		t.Errorf("containers after 4 concurrent calls at target concurrency 2: %d, want 2", len(got))
	}
}
