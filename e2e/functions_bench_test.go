package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/fnagent"
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
	if os.Getenv("MERCATOR_FN_BENCH_INPROC") != "" {
		c.startAgent("bench")
		where = "agent in the test's process"
	} else {
		agentPID = c.startProcessAgent("bench", "--fn-memory", "2GiB").cmd.Process.Pid
	}
	_, fn := c.deployHello("bench", api.Fn{Image: image, IdleTimeout: 120})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
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
		cpu        cpuTimes // per call
	}
	run := func(name string, fnID string, call func() error, conc int) phase {
		// Warm: enough calls, concurrently, for the hot containers this
		// concurrency needs to exist.
		var wg sync.WaitGroup
		for w := 0; w < conc; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 50; i++ {
					if err := call(); err != nil {
						t.Errorf("%s warm-up: %v", name, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		lat := make([]time.Duration, calls)
		var next atomic.Int64
		cpu0 := readCPU(t, agentPID, fnID)
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
		cpu := readCPU(t, agentPID, fnID).minus(cpu0).per(calls)
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
	fmt.Printf("\nFunctions benchmark: %s, %d calls per phase, %s\n", imageName, calls, where)
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
	fmt.Printf("(test process = load generator + control plane + the node-alone engine; dockerd is shared with anything else on the machine)\n")
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

// countFnContainers counts the daemon's running containers of a function.
func countFnContainers(t testing.TB, fnID string) int {
	out, err := execOutput("docker", "ps", "-q", "--filter", "label=mercator.fn="+fnID)
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	return len(strings.Fields(out))
}

// cpuTimes is CPU time consumed, by whom.
type cpuTimes struct {
	self, agent, dockerd, containers time.Duration
}

func (a cpuTimes) minus(b cpuTimes) cpuTimes {
	return cpuTimes{a.self - b.self, a.agent - b.agent, a.dockerd - b.dockerd, a.containers - b.containers}
}

func (a cpuTimes) per(n int) cpuTimes {
	d := time.Duration(n)
	return cpuTimes{a.self / d, a.agent / d, a.dockerd / d, a.containers / d}
}

func (a cpuTimes) String() string {
	us := func(d time.Duration) int64 { return d.Microseconds() }
	return fmt.Sprintf("test process %d, agent process %d, dockerd %d, containers %d, total %d",
		us(a.self), us(a.agent), us(a.dockerd), us(a.containers), us(a.self+a.agent+a.dockerd+a.containers))
}

// readCPU reads the CPU time of this process, the agent process (0: none),
// the Docker daemon, and the function's containers (cgroup v1 cpuacct or
// v2 cpu.stat; 0 where neither is found).
func readCPU(t testing.TB, agentPID int, fnID string) cpuTimes {
	var c cpuTimes
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	c.agent = procCPU(agentPID)
	if raw, err := os.ReadFile("/var/run/docker.pid"); err == nil {
		pid, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
		c.dockerd = procCPU(pid)
	}
	out, _ := execOutput("docker", "ps", "-q", "--no-trunc", "--filter", "label=mercator.fn="+fnID)
	for _, id := range strings.Fields(out) {
		if raw, err := os.ReadFile("/sys/fs/cgroup/cpuacct/docker/" + id + "/cpuacct.usage"); err == nil {
			ns, _ := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
			c.containers += time.Duration(ns)
			continue
		}
		for _, p := range []string{"/sys/fs/cgroup/system.slice/docker-" + id + ".scope/cpu.stat", "/sys/fs/cgroup/docker/" + id + "/cpu.stat"} {
			if raw, err := os.ReadFile(p); err == nil {
				for _, line := range strings.Split(string(raw), "\n") {
					if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
						us, _ := strconv.ParseInt(v, 10, 64)
						c.containers += time.Duration(us) * time.Microsecond
					}
				}
				break
			}
		}
	}
	return c
}

// procCPU is a process's user and system time from /proc (0 if unknown).
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command may contain spaces; fields count from after its ')'.
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(fields[11], 10, 64)
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // CLK_TCK is 100 on Linux
}
