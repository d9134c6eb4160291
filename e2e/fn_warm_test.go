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

// TestFunctionMaxHot: four concurrent calls of a function capped at two
// containers across the fleet are served by two containers, the others
// waiting for them rather than starting more.
func TestFunctionMaxHot(t *testing.T) {
	c := startCluster(t)
	c.startAgent("capped")
	_, fn := c.deployHello("capped", api.Fn{Name: "raw", Image: c.publish("fn-raw"), IdleTimeout: 60,
		Annotations: api.Annotations{api.AnnotationMaxHot: json.RawMessage(`2`)}})
	slowCallsAtOnce(t, c, fn.ID, 4)
	if got := fnContainers(t, fn.ID); len(got) != 2 {
		t.Errorf("containers after 4 concurrent calls with max-hot 2: %d, want 2", len(got))
	}
}

// slowCallsAtOnce makes n calls of fnID at once, each holding its
// container 1.5 s (fn-raw's sleep), and fails the test unless every one
// answers 200: what the warm-capacity tests count containers after.
func slowCallsAtOnce(t *testing.T, c *cluster, fnID string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			res, err := c.client.Invoke(c.ctx, fnID, strings.NewReader("x"), http.Header{"X-Test": {"sleep:1500"}}, &out)
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
			t.Fatalf("a call of function %s: %v", fnID, err)
		}
	}
}
