package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/fnagent"
	"github.com/mercator/mercator/internal/cputime"
)

// TestFunctionBench measures a trivial FDK function (testdata/images/fn-fdk
// answering an empty call: Fn's Go FDK, a JSON answer, no output; set
// MERCATOR_FN_BENCH_IMAGE=fn-hello for the sample function, which also
// writes a log line per call, which the Docker daemon then copies twice)
// called through the control plane into a hot container on an agent that
// runs in a process of its own, against the node alone (fnagent.Engine.Call
// on the same image, in this process), in the same run: latency p50 and
// p99 at concurrency 1, and throughput and latency at concurrency 8, with
// the ratios. It never fails on the figures: it prints them (and a line per
// target) for the record. Run it with
//
//	MERCATOR_FN_BENCH=1 go test ./e2e -run TestFunctionBench -v -count=1
//
// MERCATOR_FN_BENCH_CALLS sets the calls per phase (default 3000).
func TestFunctionBench(t *testing.T) {
	if os.Getenv("MERCATOR_FN_BENCH") == "" {
		t.Skip("a benchmark: set MERCATOR_FN_BENCH=1 to run it")
	}
	calls := 3000
	if n, err := strconv.Atoi(os.Getenv("MERCATOR_FN_BENCH_CALLS")); err == nil && n > 0 {
		calls = n
	}
	c := startCluster(t)
	imageName := "fn-fdk"
	if v := os.Getenv("MERCATOR_FN_BENCH_IMAGE"); v != "" {
		imageName = v
	}
	image := c.publish(imageName)
	body := `{}`

	// The node alone: the engine, in this process, on the same image.
	engine, err := fnagent.New(fnagent.Config{NodeID: uniqueNodeID(t, "bench-engine"), SocketRoot: t.TempDir(),
		Tracker: fnagent.NewResourceTracker(fnagent.Capacity{MemoryBytes: 4 << 30, MilliCPUs: 8000})})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close(context.Background())
	fc := fnagent.FunctionConfig{ID: "bench-alone", Image: image, MemoryMB: 128, IdleTimeout: time.Minute}
	var seq atomic.Int64
	alone := func() error {
		rec := &discardWriter{h: http.Header{}}
		_, err := engine.Call(c.ctx, fc, fnagent.CallRequest{ID: fmt.Sprintf("b%d", seq.Add(1)), Body: strings.NewReader(body),
			ContentLength: int64(len(body)), Header: http.Header{"Content-Type": {"application/json"}}}, rec)
		if err == nil && rec.status != 200 {
			err = fmt.Errorf("status %d", rec.status)
		}
		return err
	}

	// Through the control plane, to an agent process (in this process with
	// MERCATOR_FN_BENCH_INPROC=1, which is how to profile both sides).
	where := "agent in its own process"
	agentPID := 0
	var agentNode string
	if os.Getenv("MERCATOR_FN_BENCH_INPROC") != "" {
		agentNode = c.startAgent("bench")
		where = "agent in the test's process"
	} else {
		agent := c.startProcessAgent("bench", "--fn-memory", "2GiB")
		agentPID, agentNode = agent.cmd.Process.Pid, agent.nodeID
	}
	_, fn := c.deployHello("bench", api.Fn{Image: image, IdleTimeout: 120})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true, TLSClientConfig: c.tlsConfig()}}
	url := c.url + "/invoke/" + fn.ID
	through := func() error {
		req, _ := http.NewRequestWithContext(c.ctx, http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+c.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}

	type phase struct {
		lat        []time.Duration
		throughput float64
		cpu        cputime.Sample // per call
	}
	// starting counts the function's containers not ready yet: those the
	// engine reports starting, and, through the control plane, those the
	// daemon holds beyond the ready ones in the node's last facts (which
	// may predate a launch).
	starting := func(fnID string) int {
		if fnID == "bench-alone" {
			n := 0
			for _, s := range engine.Stats() {
				n += s.Starting
			}
			return n
		}
		n, err := c.client.GetNode(c.ctx, agentNode)
		if err != nil || n.Facts == nil {
			return -1
		}
		var fc struct {
			Containers []struct {
				FnID                 string `json:"fn_id"`
				Idle, Busy, Starting int
			} `json:"containers"`
		}
		raw, _ := json.Marshal((*n.Facts)["functions"])
		if json.Unmarshal(raw, &fc) != nil {
			return -1
		}
		ready := 0
		for _, ct := range fc.Containers {
			if ct.FnID == fnID {
				if ct.Starting > 0 {
					return ct.Starting
				}
				ready = ct.Idle + ct.Busy
			}
		}
		return countFnContainers(t, fnID) - ready
	}
	run := func(name string, fnID string, call func() error, conc int) phase {
		// Warm: enough calls, concurrently, for the hot containers this
		// concurrency needs to exist. Calls the warm-up queued are often
		// served by a container that came free before the one launched
		// for them was ready, so launches outlast it: they are waited for
		// and warmed in turn, because a launch in the measured phase would
		// count its CPU (most of it in processes no figure names) and the
		// moment its container joins.
		var wg sync.WaitGroup
		warm := func(n int) {
			for w := 0; w < conc; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < n; i++ {
						if err := call(); err != nil {
							t.Errorf("%s warm-up: %v", name, err)
							return
						}
					}
				}()
			}
			wg.Wait()
		}
		warm(50)
		c.waitFor(name+": no container starting", func() bool { return starting(fnID) == 0 })
		warm(20)
		lat := make([]time.Duration, calls)
		var next atomic.Int64
		ids := fnContainerIDs(t, fnID)
		cpu0 := cputime.Take(agentPID, ids)
		start := time.Now()
		for w := 0; w < conc; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= int64(calls) {
						return
					}
					t0 := time.Now()
					if err := call(); err != nil {
						t.Errorf("%s: %v", name, err)
						return
					}
					lat[i] = time.Since(t0)
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		// A container started during the phase counts in full: it read as
		// zero at the start.
		ids = slices.Compact(slices.Sorted(slices.Values(append(ids, fnContainerIDs(t, fnID)...))))
		cpu := cputime.Take(agentPID, ids).Minus(cpu0).Per(calls)
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		return phase{lat: lat, throughput: float64(calls) / elapsed.Seconds(), cpu: cpu}
	}
	pct := func(p phase, q float64) time.Duration { return p.lat[int(float64(len(p.lat)-1)*q)] }
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d.Microseconds())/1000) }

	alone1 := run("alone c=1", "bench-alone", alone, 1)
	through1 := run("through c=1", fn.ID, through, 1)
	alone8 := run("alone c=8", "bench-alone", alone, 8)
	through8 := run("through c=8", fn.ID, through, 8)
	aloneContainers, throughContainers := countFnContainers(t, "bench-alone"), countFnContainers(t, fn.ID)
	if t.Failed() {
		return
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("\nFunctions benchmark: %s, %d calls per phase, %s (load average at end: %s)\n", imageName, calls, where, strings.TrimSpace(string(load)))
	fmt.Printf("%-28s %12s %12s %12s\n", "", "node alone", "through CP", "ratio")
	row := func(name string, a, b time.Duration) {
		fmt.Printf("%-28s %12s %12s %12.2f\n", name, ms(a), ms(b), float64(b)/float64(a))
	}
	row("c=1 p50", pct(alone1, 0.5), pct(through1, 0.5))
	row("c=1 p99", pct(alone1, 0.99), pct(through1, 0.99))
	row("c=8 p50", pct(alone8, 0.5), pct(through8, 0.5))
	row("c=8 p99", pct(alone8, 0.99), pct(through8, 0.99))
	fmt.Printf("%-28s %12.0f %12.0f %12.2f\n", "c=1 calls/s", alone1.throughput, through1.throughput, through1.throughput/alone1.throughput)
	fmt.Printf("%-28s %12.0f %12.0f %12.2f\n", "c=8 calls/s", alone8.throughput, through8.throughput, through8.throughput/alone8.throughput)
	fmt.Printf("%-28s %12d %12d\n", "containers after c=8", aloneContainers, throughContainers)
	fmt.Printf("CPU per call at c=8 (µs): node alone: %v; through CP: %v\n", alone8.cpu, through8.cpu)
	fmt.Printf("CPU per call at c=1 (µs): node alone: %v; through CP: %v\n", alone1.cpu, through1.cpu)
	fmt.Printf("(self = this test process: load generator, control plane, node-alone engine; process = the agent's; dockerd and containerd are shared with anything else on the machine, and machine is all of it)\n")
	fmt.Printf("targets: c=1 p50 through CP ≤ 1 ms: %v (%s); c=8 ≥ 2000 calls/s with ≤ 8 containers: %v (%.0f calls/s, %d containers)\n\n",
		pct(through1, 0.5) <= time.Millisecond, ms(pct(through1, 0.5)),
		through8.throughput >= 2000 && throughContainers <= 8, through8.throughput, throughContainers)
}

// discardWriter is an http.ResponseWriter that keeps the status only.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) WriteHeader(s int)   { w.status = s }
func (w *discardWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = 200
	}
	return len(p), nil
}

// fnContainerIDs is the full IDs of the daemon's containers of a function,
// running or not.
func fnContainerIDs(t testing.TB, fnID string) []string {
	out, err := execOutput("docker", "ps", "-aq", "--no-trunc", "--filter", "label=mercator.fn="+fnID)
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	return strings.Fields(out)
}

// countFnContainers counts the daemon's containers of a function.
func countFnContainers(t testing.TB, fnID string) int { return len(fnContainerIDs(t, fnID)) }
