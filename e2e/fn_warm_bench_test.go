package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
)

// TestFunctionWarmStepBench drives a function with warm capacity (min_hot
// 1, max_hot the peak) through a load that steps 1 → peak → 1 concurrent
// callers, each call holding its container 100 ms (fn-raw's sleep), and
// prints per step: calls, latency p50/p99, the calls that waited for a
// container (latency 100 ms or more above the call's own 100 ms) with their
// p99, and the containers seen (sampled every 250 ms), the most of them
// against max_hot; then how long the fleet took to come back to min_hot
// after the last step, and to zero once min_hot is lifted. It never fails
// on the figures. Run it with
//
//	MERCATOR_FN_BENCH=1 go test ./e2e -run TestFunctionWarmStepBench -v -count=1
//
// MERCATOR_FN_STEP_PEAK sets the peak (default 50), MERCATOR_FN_STEP_SECONDS
// each step's length (default 60).
func TestFunctionWarmStepBench(t *testing.T) {
	if os.Getenv("MERCATOR_FN_BENCH") == "" {
		t.Skip("a benchmark: set MERCATOR_FN_BENCH=1 to run it")
	}
	peak, step := 50, 60*time.Second
	if n, err := strconv.Atoi(os.Getenv("MERCATOR_FN_STEP_PEAK")); err == nil && n > 0 {
		peak = n
	}
	if n, err := strconv.Atoi(os.Getenv("MERCATOR_FN_STEP_SECONDS")); err == nil && n > 0 {
		step = time.Duration(n) * time.Second
	}
	c := startCluster(t)
	c.startAgent("step")
	const window = 5 // seconds: the scale-down window (idle timeout)
	_, fn := c.deployHello("step", api.Fn{Name: "raw", Image: c.publish("fn-raw"), Memory: 16, IdleTimeout: window,
		Annotations: api.Annotations{api.AnnotationMinHot: json.RawMessage(`1`), api.AnnotationMaxHot: json.RawMessage(strconv.Itoa(peak))}})
	c.waitFor("the held container", func() bool { return len(fnContainers(t, fn.ID)) == 1 })

	// Containers over time.
	var mu sync.Mutex
	var samples []int
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
				n := len(fnContainers(t, fn.ID))
				mu.Lock()
				samples = append(samples, n)
				mu.Unlock()
			}
		}
	}()
	const hold = 100 * time.Millisecond
	phase := func(callers int) (lat []time.Duration, first, last int) {
		mu.Lock()
		first = len(samples)
		mu.Unlock()
		end := time.Now().Add(step)
		var wg sync.WaitGroup
		var lmu sync.Mutex
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					var out bytes.Buffer
					start := time.Now()
					res, err := c.client.Invoke(c.ctx, fn.ID, strings.NewReader("x"), http.Header{"X-Test": {"sleep:100"}}, &out)
					if err != nil || res.Status != 200 {
						t.Errorf("call: %v %d %s", err, res.Status, out.String())
						return
					}
					lmu.Lock()
					lat = append(lat, time.Since(start))
					lmu.Unlock()
				}
			}()
		}
		wg.Wait()
		mu.Lock()
		last = len(samples)
		mu.Unlock()
		return lat, first, last
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }
	pct := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}
	fmt.Printf("\nWarm capacity, 1 → %d → 1 callers, %v a step, each call 100 ms in its container, min_hot 1, max_hot %d, window %ds\n", peak, step, peak, window)
	fmt.Printf("%-8s %7s %9s %9s %8s %10s %16s\n", "callers", "calls", "p50", "p99", "waited", "wait p99", "containers min-max")
	most := 0
	for _, callers := range []int{1, peak, 1} {
		lat, first, last := phase(callers)
		var waits []time.Duration
		for _, l := range lat {
			if l-hold >= 100*time.Millisecond {
				waits = append(waits, l-hold)
			}
		}
		mu.Lock()
		seen := slices.Clone(samples[first:last])
		mu.Unlock()
		lo, hi := 0, 0
		if len(seen) > 0 {
			lo, hi = slices.Min(seen), slices.Max(seen)
		}
		most = max(most, hi)
		fmt.Printf("%-8d %7d %9s %9s %8d %10s %10d-%d\n", callers, len(lat), ms(pct(lat, 0.5)), ms(pct(lat, 0.99)), len(waits), ms(pct(waits, 0.99)), lo, hi)
	}
	start := time.Now()
	c.waitFor("back to min_hot", func() bool { return len(fnContainers(t, fn.ID)) == 1 })
	toMin := time.Since(start)
	if _, err := c.client.UpdateFn(c.ctx, fn.ID, api.Fn{Annotations: api.Annotations{api.AnnotationMinHot: json.RawMessage(`0`)}}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	c.waitFor("scale to zero", func() bool { return len(fnContainers(t, fn.ID)) == 0 })
	toZero := time.Since(start)
	close(stopSampling)
	<-sampled
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("most containers seen: %d (max_hot %d: %v); back to min_hot %s after the last step; to zero %s after min_hot 0 (window %ds)\n",
		most, peak, most <= peak, ms(toMin), ms(toZero), window)
	fmt.Printf("(load average at end: %s)\n\n", strings.TrimSpace(string(load)))
}
