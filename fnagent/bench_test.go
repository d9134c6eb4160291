package fnagent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/fnagent/internal/callconn"
	"github.com/mercator/mercator/fnagent/internal/fdksocket"
	"github.com/mercator/mercator/internal/cputime"
)

// TestNodeBench is the node-alone benchmark of issue #5: hot-call latency
// and throughput of a trivial FDK function through Engine.Call, at
// concurrency 1 and 8, against a direct HTTP/1.1 POST over the same
// containers' sockets on a connection kept per container (the floor; the
// same with a fresh connection per call is shown too), with the CPU per
// call of this process, the daemon, containerd and the containers; and
// cold-start time against a raw `docker run` of the same image. It only
// runs with MERCATOR_FN_NODE_BENCH=1:
//
//	MERCATOR_FN_NODE_BENCH=1 go test ./fnagent -run TestNodeBench -v
//
// MERCATOR_FN_NODE_BENCH_HOT (calls per worker, default 2000 at concurrency
// 1 and 1000 per worker at 8) and MERCATOR_FN_NODE_BENCH_COLD (cold starts,
// default 10) scale it. Wall-clock figures are printed, never asserted; the
// one assertion is a correctness property: at concurrency 8 the engine
// starts at most 8 containers.
func TestNodeBench(t *testing.T) {
	if os.Getenv("MERCATOR_FN_NODE_BENCH") != "1" {
		t.Skip("set MERCATOR_FN_NODE_BENCH=1 to run the node benchmark")
	}
	hot1, hot8, coldN := 2000, 1000, 10
	if v, err := strconv.Atoi(os.Getenv("MERCATOR_FN_NODE_BENCH_HOT")); err == nil && v > 0 {
		hot1, hot8 = v, v
	}
	if v, err := strconv.Atoi(os.Getenv("MERCATOR_FN_NODE_BENCH_COLD")); err == nil && v > 0 {
		coldN = v
	}

	started := &startCounter{}
	te := newTestEngine(t, func(c *Config) {
		// No pausing: the floor calls bypass the engine, and a container
		// paused under them would hang them.
		c.PauseAfter = -1
		started.next = c.Metrics
		c.Metrics = started
	})
	fn := fnConfig(t, "bench", fdkImage)
	fn.IdleTimeout = 10 * time.Minute
	body := []byte(`{}`)

	// Warm one hot container (this pulls the image too).
	warm := benchEngineCall(te.Engine, fn, "warm", body)
	if warm.err != nil {
		t.Fatalf("warm-up call: %v", warm.err)
	}
	for i := 0; i < 100; i++ {
		if r := benchEngineCall(te.Engine, fn, "warm-"+strconv.Itoa(i), body); r.err != nil {
			t.Fatalf("warm-up call: %v", r.err)
		}
	}
	if n := started.n.Load(); n != 1 {
		t.Fatalf("%d containers started by sequential warm-up calls; want 1", n)
	}

	nfn, err := fn.normalized()
	if err != nil {
		t.Fatal(err)
	}
	hotKey := nfn.poolKey()
	hotIDs := func() []string { return benchContainerIDs(te.Engine, hotKey) }
	// settle waits for the launches the warm-up left under way: calls it
	// queued are often served by a container that came free before the one
	// launched for them was ready. A launch in the measured run would count
	// its CPU (most of it in processes no figure names) and the moment its
	// container joins, and the floor would find fewer containers than the
	// engine ends with.
	settle := func() {
		eventually(t, time.Minute, "no container starting", func() bool {
			for _, s := range te.Stats() {
				if s.Key == hotKey && s.Starting > 0 {
					return false
				}
			}
			return true
		})
	}

	// Concurrency 1.
	eng1 := benchRun(t, 1, hot1, hotIDs, settle, func(worker, i int) error {
		return benchEngineCall(te.Engine, fn, fmt.Sprintf("c1-%d", i), body).err
	})
	if n := started.n.Load(); n != 1 {
		t.Errorf("%d containers started after the concurrency-1 run; want 1", n)
	}
	socks := benchSockets(t, te.Engine, hotKey)
	kept := newFloor(socks, true)
	floor1 := benchRun(t, 1, hot1, hotIDs, nil, func(worker, i int) error {
		return kept.call(0, fmt.Sprintf("f1-%d", i), body)
	})
	fresh := newFloor(socks, false)
	fresh1 := benchRun(t, 1, hot1, hotIDs, nil, func(worker, i int) error {
		return fresh.call(0, fmt.Sprintf("n1-%d", i), body)
	})
	kept.close()

	// Concurrency 8.
	before := started.n.Load()
	eng8 := benchRun(t, 8, hot8, hotIDs, settle, func(worker, i int) error {
		return benchEngineCall(te.Engine, fn, fmt.Sprintf("c8-%d-%d", worker, i), body).err
	})
	startedAt8 := started.n.Load() - before
	liveAt8 := started.n.Load() - started.gone.Load()
	if liveAt8 > 8 {
		t.Errorf("%d containers live after the concurrency-8 run; want at most 8", liveAt8)
	}
	if startedAt8+1 > 8 {
		t.Errorf("%d containers started for the concurrency-8 run (plus the warm one); want at most 8 in all", startedAt8)
	}
	socks = benchSockets(t, te.Engine, hotKey)
	kept = newFloor(socks, true)
	floor8 := benchRun(t, 8, hot8, hotIDs, nil, func(worker, i int) error {
		return kept.call(worker, fmt.Sprintf("f8-%d-%d", worker, i), body)
	})
	fresh = newFloor(socks, false)
	fresh8 := benchRun(t, 8, hot8, hotIDs, nil, func(worker, i int) error {
		return fresh.call(worker, fmt.Sprintf("n8-%d-%d", worker, i), body)
	})
	kept.close()

	// Cold starts: a fresh pool each time (a different config value), the
	// image already local; against docker run (CLI) and create+start (API)
	// of the same image, env, memory limit and socket mount, until the
	// socket accepts a connection. Interleaved so drift hits all three.
	var coldEng, coldCLI, coldAPI []time.Duration
	ctx := context.Background()
	for i := 0; i < coldN; i++ {
		cfn := fn
		cfn.Config = map[string]string{"BENCH_COLD": strconv.Itoa(i)}
		r := benchEngineCall(te.Engine, cfn, fmt.Sprintf("cold-%d", i), body)
		if r.err != nil || !r.report.Cold {
			t.Fatalf("cold call %d: %v (cold %v)", i, r.err, r.report.Cold)
		}
		coldEng = append(coldEng, r.took)
		if err := te.cli.ContainerRemove(ctx, r.report.ContainerID, containerRemoveForce); err != nil {
			t.Fatalf("remove the cold container: %v", err)
		}

		coldCLI = append(coldCLI, benchDockerRunCLI(t, te, cfn, i))
		coldAPI = append(coldAPI, benchDockerRunAPI(t, te, cfn, i))
	}

	load, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		load = []byte("unknown: " + err.Error())
	}
	var b strings.Builder
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }
	ratio := func(a, b time.Duration) string { return fmt.Sprintf("%.2f×", float64(a)/float64(b)) }
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	fmt.Fprintf(&b, "\nnode benchmark (load average at end: %s)\n", strings.TrimSpace(string(load)))
	fmt.Fprintf(&b, "%-28s %12s %12s %12s %12s\n", "hot calls", "p50", "mean", "p99", "calls/s")
	for _, row := range []struct {
		name string
		s    benchStats
	}{
		{fmt.Sprintf("engine  c=1 (%d)", eng1.n), eng1},
		{fmt.Sprintf("floor   c=1 (%d)", floor1.n), floor1},
		{"  fresh connections", fresh1},
		{fmt.Sprintf("engine  c=8 (8×%d)", hot8), eng8},
		{fmt.Sprintf("floor   c=8 (8×%d, %d ctr)", hot8, len(socks)), floor8},
		{"  fresh connections", fresh8},
	} {
		fmt.Fprintf(&b, "%-28s %12s %12s %12s %12.0f\n", row.name, ms(row.s.p50), ms(row.s.mean), ms(row.s.p99), row.s.rate)
	}
	fmt.Fprintf(&b, "%-28s %12s %12s %12s %12s\n", "engine/floor c=1", ratio(eng1.p50, floor1.p50), ratio(eng1.mean, floor1.mean), ratio(eng1.p99, floor1.p99), fmt.Sprintf("%.2f×", eng1.rate/floor1.rate))
	fmt.Fprintf(&b, "%-28s %12s %12s %12s %12s\n", "engine/floor c=8", ratio(eng8.p50, floor8.p50), ratio(eng8.mean, floor8.mean), ratio(eng8.p99, floor8.p99), fmt.Sprintf("%.2f×", eng8.rate/floor8.rate))
	over1, over8 := eng1.p50-floor1.p50, eng8.p50-floor8.p50
	fmt.Fprintf(&b, "p50 overhead over the floor: c=1 %s, c=8 %s (target ≤ 0.3 ms: %s at c=1, %s at c=8); mean overhead c=1 %s, c=8 %s\n",
		ms(over1), ms(over8), met(over1 <= 300*time.Microsecond), met(over8 <= 300*time.Microsecond), ms(eng1.mean-floor1.mean), ms(eng8.mean-floor8.mean))
	fmt.Fprintf(&b, "CPU per call (µs):\n")
	for _, row := range []struct {
		name string
		s    benchStats
	}{{"engine c=1", eng1}, {"floor  c=1", floor1}, {"fresh  c=1", fresh1}, {"engine c=8", eng8}, {"floor  c=8", floor8}, {"fresh  c=8", fresh8}} {
		fmt.Fprintf(&b, "  %s: %v\n", row.name, row.s.cpu)
	}
	fmt.Fprintf(&b, "containers started at c=8: %d new + 1 warm = %d (target ≤ 8: %s)\n",
		startedAt8, startedAt8+1, met(startedAt8+1 <= 8))
	ce, cc, ca := benchMedian(coldEng), benchMedian(coldCLI), benchMedian(coldAPI)
	fmt.Fprintf(&b, "cold start, median of %d (min–max):\n", coldN)
	fmt.Fprintf(&b, "  engine Call (fresh pool, to response) %s (%s–%s)\n", ms(ce), ms(slices.Min(coldEng)), ms(slices.Max(coldEng)))
	fmt.Fprintf(&b, "  docker run -d CLI (to socket)         %s (%s–%s)\n", ms(cc), ms(slices.Min(coldCLI)), ms(slices.Max(coldCLI)))
	fmt.Fprintf(&b, "  API create+start (to socket)          %s (%s–%s)\n", ms(ca), ms(slices.Min(coldAPI)), ms(slices.Max(coldAPI)))
	fmt.Fprintf(&b, "  engine / docker run %s (target ≤ 1.2×: %s); engine / API create+start %s\n",
		ratio(ce, cc), met(float64(ce) <= 1.2*float64(cc)), ratio(ce, ca))
	t.Log(b.String())
	fmt.Print(b.String())
}

// startCounter counts containers created and gone, and passes everything on.
type startCounter struct {
	next    Metrics
	n, gone atomic.Int64
}

func (s *startCounter) CallDone(r CallReport) {
	if s.next != nil {
		s.next.CallDone(r)
	}
}

func (s *startCounter) ContainerStateChanged(from, to ContainerState) {
	if from == ContainerNone {
		s.n.Add(1)
	}
	if to == ContainerNone {
		s.gone.Add(1)
	}
	if s.next != nil {
		s.next.ContainerStateChanged(from, to)
	}
}

// discardWriter is a ResponseWriter that keeps the status and drops the body.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }

type benchResult struct {
	report CallReport
	err    error
	took   time.Duration
}

// benchEngineCall is one Engine.Call with the same request the floor sends.
func benchEngineCall(e *Engine, fn FunctionConfig, id string, body []byte) benchResult {
	w := &discardWriter{h: http.Header{}}
	start := time.Now()
	report, err := e.Call(context.Background(), fn, CallRequest{
		ID:            id,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          bytes.NewReader(body),
		ContentLength: int64(len(body)),
	}, w)
	took := time.Since(start)
	if err == nil && w.code != http.StatusOK {
		err = fmt.Errorf("status %d", w.code)
	}
	return benchResult{report: report, err: err, took: took}
}

// benchContainerIDs is the IDs of the engine's containers of the pool key.
func benchContainerIDs(e *Engine, key string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for c := range e.containers {
		if c.pool.key == key && c.id != "" {
			ids = append(ids, c.id)
		}
	}
	return ids
}

// benchSockets is the host-side socket directory of each of the pool's
// containers of the pool key, read from the engine.
func benchSockets(t *testing.T, e *Engine, key string) []string {
	t.Helper()
	e.mu.Lock()
	var dirs []string
	for c := range e.containers {
		if c.pool.key == key && c.conn != nil {
			dirs = append(dirs, c.sockDir)
		}
	}
	e.mu.Unlock()
	slices.Sort(dirs)
	if len(dirs) == 0 {
		t.Fatalf("no container in pool %s", key)
	}
	var socks []string
	for _, dir := range dirs {
		path, err := fdksocket.Resolve(dir)
		if err != nil {
			t.Fatalf("socket in %s: %v", dir, err)
		}
		socks = append(socks, path)
	}
	return socks
}

// floor makes direct HTTP/1.1 calls to containers' sockets, one client
// per socket: the best a caller of the container could do (keep: one
// connection kept per container, through the engine's own client, package
// callconn, with none of the engine's work around it), or a fresh
// connection per call through Go's standard transport (how the engine
// called before it kept them).
type floor struct {
	clients []http.RoundTripper
	closers []func()
}

func newFloor(socks []string, keep bool) *floor {
	f := &floor{}
	for _, sock := range socks {
		dial := func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
		if keep {
			cl := callconn.New(callconn.Config{Dial: dial, Idle: time.Minute, MaxHeaderBytes: 1 << 20})
			f.clients, f.closers = append(f.clients, cl), append(f.closers, cl.Close)
			continue
		}
		tr := &http.Transport{
			DialContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
			DisableKeepAlives:  true,
			DisableCompression: true,
		}
		f.clients, f.closers = append(f.clients, tr), append(f.closers, tr.CloseIdleConnections)
	}
	return f
}

func (f *floor) close() {
	for _, c := range f.closers {
		c()
	}
}

// call is one POST to the socket of worker's container with the headers
// the engine sends (Content-Type, Fn-Call-Id, Fn-Deadline).
func (f *floor) call(worker int, id string, body []byte) error {
	req, err := http.NewRequest(http.MethodPost, "http://localhost/call", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = http.Header{
		"Content-Type": {"application/json"},
		"User-Agent":   {""},
		"Fn-Call-Id":   {id},
		"Fn-Deadline":  {time.Now().Add(20 * time.Second).UTC().Format(deadlineFormat)},
	}
	resp, err := f.clients[worker%len(f.clients)].RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

type benchStats struct {
	n        int
	p50, p99 time.Duration
	// mean is the workers over the rate (Little's law): with both cores
	// saturated at concurrency 8 it is the figure the CPU per call sets,
	// where p50 also depends on how the kernel schedules the workers.
	mean time.Duration
	rate float64
	wall time.Duration
	cpu  cputime.Sample // per call
}

// benchRun runs perWorker calls on each of workers goroutines, after a
// short warm-up (and settle, when not nil, and another), and returns the latency percentiles, the throughput, and
// the CPU per call of this process, the daemon, containerd and the
// containers (by full ID, read from the engine after the warm-up).
func benchRun(t *testing.T, workers, perWorker int, containers func() []string, settle func(), call func(worker, i int) error) benchStats {
	t.Helper()
	warm := func(rounds int) {
		for i := 0; i < rounds; i++ {
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := call(w, -1-i); err != nil {
						t.Errorf("warm-up call: %v", err)
					}
				}()
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
		}
	}
	warm(50)
	if settle != nil {
		settle()
		warm(20)
	}
	lat := make([][]time.Duration, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	ids := containers()
	cpu0 := cputime.Take(0, ids)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat[w] = make([]time.Duration, 0, perWorker)
			for i := 0; i < perWorker; i++ {
				s := time.Now()
				if err := call(w, i); err != nil {
					errs[w] = fmt.Errorf("worker %d call %d: %w", w, i, err)
					return
				}
				lat[w] = append(lat[w], time.Since(s))
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	// A container launched during the run counts in full: it read as
	// zero at the start.
	cpu := cputime.Take(0, slices.Compact(slices.Sorted(slices.Values(append(ids, containers()...))))).Minus(cpu0)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	return benchStats{
		n:    len(all),
		p50:  all[len(all)/2],
		mean: wall * time.Duration(workers) / time.Duration(len(all)),
		p99:  all[(len(all)*99+99)/100-1],
		rate: float64(len(all)) / wall.Seconds(),
		wall: wall,
		cpu:  cpu.Per(len(all)),
	}
}

func benchMedian(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// benchSocketDir makes a socket directory as the engine does.
func benchSocketDir(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// benchWaitSocket polls every 500µs until a connection to the listener in
// dir succeeds.
func benchWaitSocket(t *testing.T, dir string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if path, err := fdksocket.Resolve(dir); err == nil {
			if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
				conn.Close()
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listener in %s within %v", dir, within)
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// benchDockerRunCLI times `docker run -d --network none` of fn's image
// with the engine's environment, memory limit and socket mount, until the
// socket accepts a connection; the container is removed after, untimed.
func benchDockerRunCLI(t *testing.T, te *testEngine, fn FunctionConfig, i int) time.Duration {
	t.Helper()
	dir := benchSocketDir(t, fmt.Sprintf("cli-%d", i))
	mem := strconv.FormatInt(fn.MemoryMB, 10) + "m"
	args := []string{"run", "-d", "--network", "none", "--memory", mem, "--memory-swap", mem,
		"--label", dockerengine.LabelNode + "=" + te.node,
		"--mount", "type=bind,source=" + dir + ",target=" + fdksocket.DirInContainer}
	for _, kv := range containerEnv(fn) {
		args = append(args, "-e", kv)
	}
	args = append(args, fn.Image)
	start := time.Now()
	out, err := exec.Command("docker", args...).Output()
	if err != nil {
		t.Fatalf("docker run: %v", err)
	}
	benchWaitSocket(t, dir, 15*time.Second)
	took := time.Since(start)
	if err := te.cli.ContainerRemove(context.Background(), strings.TrimSpace(string(out)), containerRemoveForce); err != nil {
		t.Fatalf("remove: %v", err)
	}
	return took
}

// benchDockerRunAPI is benchDockerRunCLI through the Engine API: create
// and start, no CLI process.
func benchDockerRunAPI(t *testing.T, te *testEngine, fn FunctionConfig, i int) time.Duration {
	t.Helper()
	dir := benchSocketDir(t, fmt.Sprintf("api-%d", i))
	ctx := context.Background()
	memory := fn.MemoryMB << 20
	start := time.Now()
	created, err := te.cli.ContainerCreate(ctx,
		&container.Config{Image: fn.Image, Env: containerEnv(fn), Labels: map[string]string{dockerengine.LabelNode: te.node}},
		&container.HostConfig{
			Mounts:      []mount.Mount{{Type: mount.TypeBind, Source: dir, Target: fdksocket.DirInContainer}},
			NetworkMode: "none",
			Resources:   container.Resources{Memory: memory, MemorySwap: memory},
		}, nil, nil, "")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := te.cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		t.Fatalf("start: %v", err)
	}
	benchWaitSocket(t, dir, 15*time.Second)
	took := time.Since(start)
	if err := te.cli.ContainerRemove(ctx, created.ID, containerRemoveForce); err != nil {
		t.Fatalf("remove: %v", err)
	}
	return took
}
