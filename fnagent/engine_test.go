package fnagent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/failure"
)

// TestHelloColdThenHot calls the sample function, built with Fn's Go FDK,
// cold (the image pulled by digest, a container started) and then hot,
// and logs the latencies.
func TestHelloColdThenHot(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "hello", helloImage)

	first := te.mustCall(fn, "", `{"name":"Mercator"}`)
	if got := strings.TrimSpace(first.body()); got != `{"message":"Hello, Mercator"}` {
		t.Fatalf("body = %q", got)
	}
	if ct := first.rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	if v := first.rec.Header().Get("Fn-Fdk-Version"); !strings.HasPrefix(v, "fdk-go/") {
		t.Errorf("Fn-Fdk-Version = %q; want the FDK's", v)
	}
	if !first.report.Cold || first.report.ContainerID == "" {
		t.Fatalf("first call report %+v; want cold", first.report)
	}

	// Another configuration of the same image: a cold start without the pull.
	other := fn
	other.Config = map[string]string{"GREETING": "other"}
	coldNoPull := te.mustCall(other, "", `{}`)
	if !coldNoPull.report.Cold || coldNoPull.report.ContainerID == first.report.ContainerID {
		t.Fatalf("a config change must be a new pool: %+v", coldNoPull.report)
	}
	if got := strings.TrimSpace(coldNoPull.body()); got != `{"message":"Hello, World"}` {
		t.Fatalf("body = %q", got)
	}

	var hot []time.Duration
	for i := 0; i < 20; i++ {
		r := te.mustCall(fn, "", `{"name":"again"}`)
		if r.report.Cold || r.report.ContainerID != first.report.ContainerID {
			t.Fatalf("hot call %d: %+v; want the first container, warm", i, r.report)
		}
		hot = append(hot, r.took)
	}
	slices.Sort(hot)
	t.Logf("fn-hello latency: cold with pull %v, cold %v, hot median %v (min %v, max %v)",
		first.took.Round(time.Millisecond), coldNoPull.took.Round(time.Millisecond),
		hot[len(hot)/2].Round(10*time.Microsecond), hot[0].Round(10*time.Microsecond), hot[len(hot)-1].Round(10*time.Microsecond))

	logs, ok := te.Logs(first.report.CallID)
	if !ok || !strings.Contains(string(logs.Data), "greeting Mercator") || strings.Contains(string(logs.Data), "again") {
		t.Errorf("logs of the first call = %q (found %v); want its own line only", logs.Data, ok)
	}
	snap := te.counts.Snapshot()
	if snap.Calls != 22 || snap.Cold != 2 || len(snap.Errors) != 0 || snap.Containers[ContainerIdle]+snap.Containers[ContainerPaused] != 2 {
		t.Errorf("counters %+v", snap)
	}
}

// TestConcurrencyLaunchesOnlyWhenNeededAndReusesLIFO: sequential calls
// share one container; a call that arrives while it is busy gets a second;
// the most recently used idle container serves the next call.
func TestConcurrencyLaunchesOnlyWhenNeededAndReusesLIFO(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "lifo", fdkImage)

	a := te.mustCall(fn, "", `{}`).report.ContainerID
	for i := 0; i < 3; i++ {
		if id := te.mustCall(fn, "", `{}`).report.ContainerID; id != a {
			t.Fatalf("sequential call %d went to %s; want %s", i, id, a)
		}
	}
	if n := len(te.containers()); n != 1 {
		t.Fatalf("%d containers after sequential calls; want 1", n)
	}

	// X holds A far longer than a cold start takes even on a loaded
	// machine; Y arrives while A is busy and gets a new container B (had A
	// come back first, Y would have taken it, and B gone idle). Y answers
	// at once, so A, released when X ends, is the most recently used, and
	// the calls after the burst go to it.
	var wg sync.WaitGroup
	var x, y result
	wg.Add(2)
	go func() { defer wg.Done(); x = te.call(fn, "", `{"sleep_ms":10000}`) }()
	eventually(t, 30*time.Second, "X busy", func() bool { s := te.Stats(); return len(s) == 1 && s[0].Busy == 1 })
	go func() { defer wg.Done(); y = te.call(fn, "", `{}`) }()
	wg.Wait()
	if x.err != nil || y.err != nil {
		t.Fatalf("concurrent calls: %v, %v", x.err, y.err)
	}
	b := y.report.ContainerID
	if x.report.ContainerID != a || b == a || !y.report.Cold {
		t.Fatalf("X on %s, Y on %s (cold %v); want X on A=%s and Y on a new container", x.report.ContainerID, b, y.report.Cold, a)
	}
	for i := 0; i < 2; i++ {
		if id := te.mustCall(fn, "", `{}`).report.ContainerID; id != a {
			t.Fatalf("after the burst, call %d went to %s; want the most recently used %s", i, id, a)
		}
	}
	if s := te.Stats(); len(s) != 1 || s[0].Idle != 2 {
		t.Fatalf("stats %+v; want two idle containers", s)
	}
}

// TestPauseUnpauseAndIdleRemoval: an idle container is paused after
// PauseAfter, unpaused by the next call, and removed after IdleTimeout.
func TestPauseUnpauseAndIdleRemoval(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, func(c *Config) { c.PauseAfter = 150 * time.Millisecond })
	fn := fnConfig(t, "pause", fdkImage)
	fn.IdleTimeout = 2 * time.Second

	id := te.mustCall(fn, "", `{}`).report.ContainerID
	eventually(t, 30*time.Second, "container paused", func() bool {
		s := te.Stats()
		return te.state(id) == "paused" && len(s) == 1 && s[0].Paused == 1
	})
	r := te.mustCall(fn, "", `{}`)
	if r.report.ContainerID != id {
		t.Fatalf("call after pause went to %s; want the paused %s", r.report.ContainerID, id)
	}
	var out struct{ Calls int }
	if err := json.Unmarshal(r.rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("response %q: %v", r.rec.Body.Bytes(), err)
	}
	if out.Calls != 2 {
		t.Fatalf("the unpaused process served %d calls; want 2", out.Calls)
	}
	t.Logf("call to a paused container took %v", r.took.Round(time.Millisecond))
	eventually(t, 30*time.Second, "container removed after idle_timeout", func() bool { return te.state(id) == "gone" })
	eventually(t, 30*time.Second, "pool dropped", func() bool { return len(te.Stats()) == 0 })
}

// TestFunctionErrorKeepsContainer: 502 is the function's error; the
// container serves the next call.
func TestFunctionErrorKeepsContainer(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "fail", rawImage)

	r := te.call(fn, "status:502", "")
	var ce *CallError
	if !errors.As(r.err, &ce) || ce.Kind != KindFunctionFailed || ce.Partial || r.rec.wrote {
		t.Fatalf("err = %v (wrote %v); want function_failed with nothing written", r.err, r.rec.wrote)
	}
	next := te.mustCall(fn, "echo", "hi")
	if next.report.ContainerID != r.report.ContainerID || next.body() != "calls=2 hi" {
		t.Fatalf("next call: %s on %s; want calls=2 on the same container", next.body(), next.report.ContainerID)
	}
	if snap := te.counts.Snapshot(); snap.Errors[KindFunctionFailed] != 1 {
		t.Errorf("errors %v", snap.Errors)
	}
}

// TestTimeoutReplacesContainer: a call past its deadline is a timeout; its
// container is replaced, and its late output never reaches the next call.
// The FDK's own 504 is a timeout too.
func TestTimeoutReplacesContainer(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "slow", rawImage)
	fn.Timeout = 10 * time.Second

	warm := te.mustCall(fn, "echo", "")
	// The function would answer after 30 s: a call that returns sooner
	// returned at its deadline, not at the function's answer.
	r := te.call(fn, "sleep:30000", "", func(c *CallRequest) { c.Deadline = time.Now().Add(700 * time.Millisecond) })
	if !errors.Is(r.err, ErrTimeout) || r.took >= 30*time.Second {
		t.Fatalf("err = %v after %v; want a timeout at the deadline", r.err, r.took)
	}
	if r.report.ContainerID != warm.report.ContainerID {
		t.Fatalf("the slow call ran on %s; want the warm %s", r.report.ContainerID, warm.report.ContainerID)
	}
	eventually(t, 10*time.Second, "timed-out container removed", func() bool { return te.state(warm.report.ContainerID) == "gone" })
	next := te.mustCall(fn, "echo", "clean")
	if next.report.ContainerID == warm.report.ContainerID || next.body() != "calls=1 clean" {
		t.Fatalf("next call %q on %s; want a fresh container's first call", next.body(), next.report.ContainerID)
	}

	r = te.call(fn, "status:504", "")
	if !errors.Is(r.err, ErrTimeout) {
		t.Fatalf("FDK 504: err = %v; want a timeout", r.err)
	}
	eventually(t, 10*time.Second, "504 container removed", func() bool { return te.state(r.report.ContainerID) == "gone" })
}

// TestConnectionKeptBetweenCalls: a container's calls share one
// connection to its socket while each ends cleanly; a response the engine
// did not read to its end (a 502 with more than the snippet it reads)
// costs the connection, not the container; a connection the server closes
// while idle is replaced without failing the next call; and no connection
// is kept across a pause.
func TestConnectionKeptBetweenCalls(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, func(c *Config) { c.PauseAfter = -1 })
	fn := fnConfig(t, "conn", rawImage)
	// conn is the container and the connection a call came on.
	conn := func() string {
		t.Helper()
		r := te.mustCall(fn, "conn", "")
		return r.report.ContainerID + " " + r.body()
	}

	first := conn()
	for i := 0; i < 3; i++ {
		if got := conn(); got != first {
			t.Fatalf("sequential call %d on %s; want the first call's %s", i, got, first)
		}
	}
	if got := te.mustCall(fn, "echo", "body"); got.body() != "calls=5 body" {
		t.Fatalf("a call with a body on the kept connection: %q", got.body())
	}
	if got := conn(); got != first {
		t.Fatalf("after a call with a body: %s; want %s", got, first)
	}

	// A 502 is kept with its container; a long one's body was not read
	// to its end, so its connection is not.
	r := te.call(fn, "status:502:5000", "")
	if !errors.Is(r.err, ErrFunctionFailed) {
		t.Fatalf("502: err = %v", r.err)
	}
	second := conn()
	if second == first {
		t.Fatalf("the connection of a response not read to its end was kept (%s)", second)
	}
	if got := conn(); got != second {
		t.Fatalf("%s after %s; want the new connection kept", got, second)
	}
	// A short 502 is read to its end: its connection stays.
	if r := te.call(fn, "status:502", ""); !errors.Is(r.err, ErrFunctionFailed) {
		t.Fatalf("502: err = %v", r.err)
	}
	if got := conn(); got != second {
		t.Fatalf("%s after a short 502; want %s kept", got, second)
	}

	// A server that drops idle connections at once.
	closing := fnConfig(t, "conn-idle", rawImage)
	closing.Config = map[string]string{"FN_TEST_IDLE_MS": "20"}
	seen, containers := map[string]bool{}, map[string]bool{}
	for i := 0; i < 5; i++ {
		r := te.mustCall(closing, "conn", "")
		seen[r.body()], containers[r.report.ContainerID] = true, true
		time.Sleep(300 * time.Millisecond)
	}
	if len(seen) != 5 || len(containers) != 1 {
		t.Fatalf("connections %v on containers %v; want one container, a new connection for each call", seen, containers)
	}
}

// TestNoConnectionKeptAcrossPause: an idle container's connection is
// closed before it is paused, so a server whose idle timer ran out during
// the pause cannot close it under the next call.
func TestNoConnectionKeptAcrossPause(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, func(c *Config) { c.PauseAfter = 150 * time.Millisecond })
	fn := fnConfig(t, "conn-pause", rawImage)
	first := te.mustCall(fn, "conn", "")
	eventually(t, 30*time.Second, "container paused", func() bool { return te.state(first.report.ContainerID) == "paused" })
	next := te.mustCall(fn, "conn", "")
	if next.report.ContainerID != first.report.ContainerID || next.body() == first.body() {
		t.Fatalf("after the pause: %s on %s; want the same container on a new connection (not %s)",
			next.body(), next.report.ContainerID, first.body())
	}
}

// TestContractViolationsReplaceContainer: a status outside 200/502/504, a
// malformed Fn-Http-Status, or a crash mid-call.
func TestContractViolationsReplaceContainer(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "bad", rawImage)
	for _, c := range []struct {
		test string
		want *CallError
	}{
		{"status:418", ErrInvalidResponse},
		{"bad-status", ErrInvalidResponse},
		{"crash", ErrNoResponse},
	} {
		r := te.call(fn, c.test, "")
		if !errors.Is(r.err, c.want) {
			t.Fatalf("%s: err = %v; want %s", c.test, r.err, c.want.Kind)
		}
		eventually(t, 10*time.Second, c.test+": container removed", func() bool { return te.state(r.report.ContainerID) == "gone" })
	}
	r := te.call(fn, "headers", "")
	if r.err != nil || r.rec.Code != 201 || r.rec.Header().Get("X-Custom") != "yes" || r.rec.Header().Get("Fn-Http-Status") != "" || r.body() != "created" {
		t.Fatalf("gateway headers: %d %v %q", r.rec.Code, r.rec.Header(), r.body())
	}
}

// TestOutOfMemory: a function that allocates past its limit is killed,
// and the call says so.
func TestOutOfMemory(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "oom", fdkImage)
	fn.MemoryMB = 32
	r := te.call(fn, "", `{"alloc_mb":200}`)
	if !errors.Is(r.err, ErrOutOfMemory) {
		t.Fatalf("err = %v; want out_of_memory", r.err)
	}
	eventually(t, 10*time.Second, "killed container removed", func() bool { return te.state(r.report.ContainerID) == "gone" })
	if next := te.mustCall(fn, "", `{}`); next.report.ContainerID == r.report.ContainerID {
		t.Fatal("the killed container served again")
	}
}

// TestBodyLimits: bodies past the function's limits, known up front or
// found out while streaming.
func TestBodyLimits(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "limits", rawImage)
	fn.MaxResponseBytes = 1024
	fn.MaxRequestBytes = 16

	// Go's server sends a short complete body with a Content-Length: the
	// engine refuses it before writing anything.
	r := te.call(fn, "big:2000", "")
	var ce *CallError
	if !errors.As(r.err, &ce) || ce.Kind != KindResponseTooBig || ce.Partial || r.rec.wrote {
		t.Fatalf("big:2000: err = %v (wrote %v); want response_too_big before any write", r.err, r.rec.wrote)
	}
	// A long body is chunked: the engine cuts it off at the limit.
	r = te.call(fn, "big:100000", "")
	if !errors.As(r.err, &ce) || ce.Kind != KindResponseTooBig || !ce.Partial || r.rec.Body.Len() > 1024 {
		t.Fatalf("big:100000: err = %v, %d bytes written; want a partial response_too_big within the limit", r.err, r.rec.Body.Len())
	}
	big := strings.Repeat("y", 100)
	if r := te.call(fn, "echo", big); !errors.Is(r.err, ErrRequestTooBig) || r.report.ContainerID != "" {
		t.Fatalf("known-length request: err = %v, container %q; want request_too_big before dispatch", r.err, r.report.ContainerID)
	}
	r = te.call(fn, "echo", big, func(c *CallRequest) { c.ContentLength = -1 })
	if !errors.Is(r.err, ErrRequestTooBig) {
		t.Fatalf("request of unknown length: err = %v; want request_too_big", r.err)
	}
	r = te.call(fn, "echo", big, func(c *CallRequest) { c.Body, c.ContentLength = io.MultiReader(c.Body), -1 })
	if !errors.Is(r.err, ErrRequestTooBig) {
		t.Fatalf("streamed request: err = %v; want request_too_big", r.err)
	}
	r = te.call(fn, "echo", "streamed", func(c *CallRequest) { c.Body, c.ContentLength = io.MultiReader(c.Body), -1 })
	if r.err != nil || !strings.HasSuffix(r.body(), " streamed") {
		t.Fatalf("small streamed request: %q, %v", r.body(), r.err)
	}
	if r := te.mustCall(fn, "echo", "small"); !strings.HasSuffix(r.body(), " small") {
		t.Fatalf("small request: %q", r.body())
	}
}

// TestBusyWithoutWaiting: with the function at its max concurrency, or the
// node's capacity taken by a busy container, a NoWait call is refused at
// once, and a waiting call gives up after MaxSlotWait. "At once" is
// checked against the cap, not a wall-clock figure: a NoWait call that
// waited could not return before MaxSlotWait elapsed (a timer never fires
// early), and the busy call outlasts both by seconds.
func TestBusyWithoutWaiting(t *testing.T) {
	t.Parallel()
	const maxSlotWait = 2 * time.Second
	te := newTestEngine(t, func(c *Config) {
		c.MaxSlotWait = maxSlotWait
		c.Tracker = NewResourceTracker(Capacity{MemoryBytes: 100 << 20, MilliCPUs: 8000})
	})
	capped := fnConfig(t, "capped", rawImage)
	capped.MaxConcurrency = 1
	uncapped := fnConfig(t, "uncapped", rawImage) // 64 MB: one fits in 100 MB

	for _, fn := range []FunctionConfig{capped, uncapped} {
		te.mustCall(fn, "echo", "") // warm
		done := make(chan result)
		go func() { done <- te.call(fn, "sleep:6000", "") }()
		eventually(t, 30*time.Second, "first call busy", func() bool {
			for _, s := range te.Stats() {
				if s.FnID == fn.ID && s.Busy == 1 {
					return true
				}
			}
			return false
		})
		r := te.call(fn, "echo", "", func(c *CallRequest) { c.Mode = NoWait })
		if !errors.Is(r.err, ErrBusy) || !errors.Is(r.err, failure.ErrUnavailable) || r.took >= maxSlotWait {
			t.Fatalf("%s NoWait: err = %v after %v; want busy at once", fn.ID, r.err, r.took)
		}
		r = te.call(fn, "echo", "")
		if !errors.Is(r.err, ErrCapacityTimeout) || !errors.Is(r.err, failure.ErrUnavailable) || r.took < maxSlotWait {
			t.Fatalf("%s Wait: err = %v after %v; want capacity_timeout after MaxSlotWait", fn.ID, r.err, r.took)
		}
		t.Logf("%s: %v", fn.ID, r.err)
		if first := <-done; first.err != nil {
			t.Fatalf("the busy call: %v", first.err)
		}
		// The idle container of this function now holds the capacity; the
		// next function evicts it (covered by its own test), so let it go.
		for _, c := range te.containers() {
			if c.Labels[dockerengine.LabelFn] == fn.ID {
				if err := te.cli.ContainerRemove(context.Background(), c.ID, containerRemoveForce); err != nil {
					t.Fatal(err)
				}
			}
		}
		eventually(t, 10*time.Second, "removed container noticed", func() bool {
			for _, s := range te.Stats() {
				if s.FnID == fn.ID {
					return false
				}
			}
			return true
		})
	}
}

// TestEvictsIdleContainerOfAnotherFunction: with memory for only one of
// two functions, calling the second evicts the first's idle container.
func TestEvictsIdleContainerOfAnotherFunction(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, func(c *Config) {
		c.Tracker = NewResourceTracker(Capacity{MemoryBytes: 160 << 20, MilliCPUs: 8000})
	})
	a := fnConfig(t, "evictee", fdkImage)
	b := fnConfig(t, "evicter", fdkImage)
	b.MemoryMB = 128

	ra := te.mustCall(a, "", `{}`)
	rb := te.mustCall(b, "", `{}`)
	if te.state(ra.report.ContainerID) != "gone" {
		t.Fatalf("the idle container of %s was not evicted", a.ID)
	}
	if free := te.Tracker().Free(); free.MemoryBytes != 32<<20 {
		t.Fatalf("free after eviction = %v; want 32 MiB", free)
	}
	// Back to A: B's idle container goes.
	te.mustCall(a, "", `{}`)
	if te.state(rb.report.ContainerID) != "gone" {
		t.Fatal("B's idle container was not evicted for A")
	}
	// A busy container is never evicted: B cannot run while A works.
	done := make(chan result)
	go func() { done <- te.call(a, "", `{"sleep_ms":1500}`) }()
	eventually(t, 30*time.Second, "A busy", func() bool {
		for _, s := range te.Stats() {
			if s.FnID == a.ID && s.Busy == 1 {
				return true
			}
		}
		return false
	})
	if r := te.call(b, "", `{}`, func(c *CallRequest) { c.Mode = NoWait }); !errors.Is(r.err, ErrBusy) {
		t.Fatalf("B while A is busy: err = %v; want busy", r.err)
	}
	// Waiting, B gets in once A is idle again.
	if r := te.call(b, "", `{}`); r.err != nil {
		t.Fatalf("B waiting for A to finish: %v", r.err)
	}
	if r := <-done; r.err != nil {
		t.Fatal(r.err)
	}
}

// TestInitFailures: a container that never listens, one that exits, and
// one whose socket link points outside its directory.
func TestInitFailures(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	for _, c := range []struct {
		init string
		want *CallError
		text string
	}{
		{"never", ErrInitTimeout, "never listening"},
		{"exit", ErrInitFailed, "exiting at once"},
		{"escape", ErrInitTimeout, ""},
	} {
		fn := fnConfig(t, "init-"+c.init, rawImage)
		fn.InitTimeout = time.Second
		fn.Config = map[string]string{"FN_TEST_INIT": c.init}
		r := te.call(fn, "echo", "")
		if !errors.Is(r.err, c.want) || !strings.Contains(r.err.Error(), c.text) {
			t.Fatalf("%s: err = %v; want %s mentioning %q", c.init, r.err, c.want.Kind, c.text)
		}
	}
	fn := fnConfig(t, "init-direct", rawImage)
	fn.Config = map[string]string{"FN_TEST_INIT": "direct"}
	te.mustCall(fn, "echo", "")
	eventually(t, 10*time.Second, "failed containers removed", func() bool { return len(te.containers()) == 1 })
}

// TestStreaming: the first bytes of a slow response reach the caller
// before the function finishes writing: the caller's first write holds the
// first chunk alone (an engine that buffered the response would hand over
// every chunk at once). The chunks are 1.5 s apart, so only a stall that
// long could merge them; no bound is put on when they arrive.
func TestStreaming(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "stream", rawImage)
	te.mustCall(fn, "echo", "") // warm
	start := time.Now()
	r := te.mustCall(fn, "stream:3:1500", "")
	end := time.Now()
	if r.body() != "chunk 0\nchunk 1\nchunk 2\n" {
		t.Fatalf("body %q", r.body())
	}
	if got := string(r.rec.firstBytes); got != "chunk 0\n" {
		t.Fatalf("the caller's first write held %q; want the first chunk alone, streamed before the function wrote the next", got)
	}
	first := r.rec.firstWrite.Sub(start)
	t.Logf("streaming: first bytes after %v, last after %v", first.Round(time.Millisecond), end.Sub(start).Round(time.Millisecond))
}

// callsLogged calls fn (of the FDK test image) twice, each call printing
// a line of its own, and waits until each call's log is exactly its own
// output; it returns the first call's result.
func (te *testEngine) callsLogged(fn FunctionConfig) result {
	te.t.Helper()
	r1 := te.mustCall(fn, "", `{"log":["first call"]}`)
	r2 := te.mustCall(fn, "", `{"log":["second call"]}`)
	eventually(te.t, 30*time.Second, "logs arrive", func() bool {
		l1, _ := te.Logs(r1.report.CallID)
		l2, _ := te.Logs(r2.report.CallID)
		return string(l1.Data) == "first call\nfirst call\n" && string(l2.Data) == "second call\nsecond call\n"
	})
	return r1
}

// TestCallLogs: each call's output is kept under its ID, by the FDK's
// framing or, without an FDK, by which call was running.
func TestCallLogs(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	r1 := te.callsLogged(fnConfig(t, "logs-fdk", fdkImage))
	raw := fnConfig(t, "logs-raw", rawImage)
	r3 := te.mustCall(raw, "log:unframed", "")
	eventually(t, 30*time.Second, "unframed logs arrive", func() bool {
		l, _ := te.Logs(r3.report.CallID)
		return string(l.Data) == "unframed\n"
	})
	if _, ok := te.Logs("no-such-call"); ok {
		t.Fatal("logs of an unknown call")
	}
	// The daemon stores none of it: the output came through the attach
	// stream alone.
	info, err := te.cli.ContainerInspect(context.Background(), r1.report.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	if driver := info.HostConfig.LogConfig.Type; driver != "none" {
		t.Errorf("log driver %q; want none", driver)
	}
}

// TestImageFailures: a digest the registry lacks, a registry that never
// answers, and a tag.
func TestImageFailures(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, func(c *Config) { c.PullTimeout = time.Second })
	good := publish(t, rawImage)
	repo, _, _ := strings.Cut(good, "@")
	fn := fnConfig(t, "unknown", rawImage)
	fn.Image = repo + "@sha256:" + strings.Repeat("0", 64)
	if r := te.call(fn, "echo", ""); !errors.Is(r.err, ErrImagePull) {
		t.Fatalf("unknown digest: err = %v; want image_pull_failed", r.err)
	}

	// A "registry" that accepts connections and says nothing.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	fn = fnConfig(t, "hang", rawImage)
	fn.Image = l.Addr().String() + "/hang@sha256:" + strings.Repeat("1", 64)
	if r := te.call(fn, "echo", ""); !errors.Is(r.err, ErrImagePullTimeout) {
		t.Fatalf("silent registry: err = %v; want image_pull_timeout", r.err)
	}

	fn.Image = repo + ":test"
	if r := te.call(fn, "echo", ""); !errors.Is(r.err, ErrInvalidCallConfig) || !errors.Is(r.err, failure.ErrInvalid) {
		t.Fatalf("tag: err = %v; want invalid", r.err)
	}
}

// TestConfigReachesTheFunction: config is the container's environment, and
// the contract's variables are set.
func TestConfigReachesTheFunction(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "env", fdkImage)
	fn.Config = map[string]string{"GREETING": "bonjour"}
	for name, want := range map[string]string{"GREETING": "bonjour", "FN_FN_ID": "env", "FN_APP_ID": "app-env", "FN_MEMORY": "64", "FN_FORMAT": "http-stream", "FN_TYPE": "sync"} {
		r := te.mustCall(fn, "", `{"env":"`+name+`"}`)
		var out struct{ Env string }
		if err := json.Unmarshal(r.rec.Body.Bytes(), &out); err != nil || out.Env != want {
			t.Errorf("%s = %q (%v); want %q", name, out.Env, err, want)
		}
	}
	for _, c := range te.containers() {
		if c.Labels[dockerengine.LabelFn] != "env" || c.Labels[dockerengine.LabelNode] != te.node || c.Labels[dockerengine.LabelPool] == "" {
			t.Errorf("labels %v", c.Labels)
		}
	}
}

// TestRemoveOrphans removes what a previous engine on this node left.
func TestRemoveOrphans(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, nil)
	fn := fnConfig(t, "orphan", fdkImage)
	te.mustCall(fn, "", `{}`)
	// A second engine for the same node, as after an agent restart.
	// (No pool of its own: only the orphan is on the node after.)
	again, err := New(Config{NodeID: te.node, SocketRoot: t.TempDir(), Tracker: NewResourceTracker(Capacity{MemoryBytes: 1 << 30}), NetnsPool: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close(context.Background())
	n, err := again.RemoveOrphans(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("RemoveOrphans = %d, %v; want 1", n, err)
	}
	if len(te.containers()) != 0 {
		t.Fatal("orphan still there")
	}
	// The first engine notices its container is gone and launches anew.
	eventually(t, 10*time.Second, "exit noticed", func() bool { return len(te.Stats()) == 0 })
	if r := te.mustCall(fn, "", `{}`); !r.report.Cold {
		t.Fatal("want a fresh container")
	}
}
