package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	dockerclient "github.com/docker/docker/client"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/internal/cputime"
	"github.com/mercator/mercator/internal/testimage"
)

// TestFunctionFnPeerBench measures hot calls of the same fdk-go function
// (testdata/images/fn-fdk answering an empty call) on the real Fn server
// and on Mercator (control plane serving HTTPS, its agent in a process of
// its own) in one run, rounds interleaved, with wrk as the load generator
// for both. The function is created on both through the same Fn v2 calls
// (POST /v2/apps, POST /v2/fns with the same image reference) and called
// through the same POST /invoke/{fn_id}. The image is pulled into the
// local daemon first, so neither side pulls. A third side is Mercator with
// the function's log frames off (mercator.dev/log-frames "false"), the
// FDK's two writes a call that Fn does not ask for.
//
// Per round and side: the first call after a create (a function made for
// it), wrk at 1 connection and at 8 for MERCATOR_FN_PEER_SECONDS each
// (default 10), the function's running containers after the c=8 phase,
// and the CPU the server side spent per call at c=8 (Fn: its process;
// Mercator: this test process, which is the control plane and an idle
// load-free harness, plus the agent's process; the containers apart, and
// dockerd's, containerd's and the shims', which anything else on the
// machine shares, apart too). It
// prints every round and the range, with Mercator's ratio to Fn, and never
// fails on the figures. Run it with scripts/fn-peer-bench.sh, which builds
// fnserver from its repository, or by hand:
//
//	MERCATOR_FN_PEER_BENCH=/path/to/fnserver go test ./e2e -run TestFunctionFnPeerBench -v -count=1
//
// MERCATOR_FN_PEER_ROUNDS sets the rounds (default 3);
// MERCATOR_FN_PEER_INPROC=1 runs the agent in the server's process, as
// `mercator server --local-agent` does (one process, as Fn's fnserver
// is); MERCATOR_FN_PEER_AGENT_FLAGS adds `mercator agent` flags to the
// agent, in either place (e.g. "--default-cpu 0" for no CPU quota, as Fn
// sets none, or "--fn-output-relay off"). It needs wrk on PATH (Debian's package wrk).
func TestFunctionFnPeerBench(t *testing.T) {
	fnBin := os.Getenv("MERCATOR_FN_PEER_BENCH")
	if fnBin == "" {
		t.Skip("a benchmark beside Fn: set MERCATOR_FN_PEER_BENCH to an fnserver binary (scripts/fn-peer-bench.sh builds one)")
	}
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		t.Fatal("wrk is not on PATH: install it (apt-get install wrk) or run scripts/fn-peer-bench.sh")
	}
	rounds, seconds := envPositive("MERCATOR_FN_PEER_ROUNDS", 3), envPositive("MERCATOR_FN_PEER_SECONDS", 10)

	// The agent in a process of its own, or with MERCATOR_FN_PEER_INPROC=1
	// in the server's (`mercator server --local-agent`, its output relay
	// the static mercator binary as that command's own executable would
	// be; go test -cpuprofile then profiles control plane and agent
	// together).
	local, localNode := os.Getenv("MERCATOR_FN_PEER_INPROC") != "", uniqueNodeID(t, "peer")
	flags := append([]string{"--fn-memory", "2GiB"}, strings.Fields(os.Getenv("MERCATOR_FN_PEER_AGENT_FLAGS"))...)
	c := startClusterWith(t, 10*time.Second, func(o *daemon.ServerOptions) {
		o.InsecureHTTP = false
		if local {
			o.LocalAgent = localAgentFromFlags(t, localNode, append([]string{"--state", filepath.Join(o.DataDir, "agent"),
				"--heartbeat", "1s", "--fn-output-relay", buildMercator(t)}, flags...))
		}
	})
	agentPID, where := 0, "agent in the server's process (mercator server --local-agent)"
	if local {
		t.Cleanup(func() { removeContainers(t, []string{localNode}) })
		c.waitFor("the local agent's node ready", func() bool {
			n, err := c.client.GetNode(c.ctx, localNode)
			return err == nil && n.Status == "ready" && n.Facts != nil
		})
	} else {
		agentPID, where = c.startProcessAgent("peer", flags...).cmd.Process.Pid, "agent in its own process"
	}
	pinned := c.publish("fn-fdk")
	// The same reference for both: the registry's tag, which Mercator pins
	// and Fn finds in the daemon once pulled.
	image := c.registry + "/fn-fdk:test"
	if out, err := exec.Command("docker", "pull", "-q", image).CombinedOutput(); err != nil {
		t.Fatalf("docker pull %s: %v\n%s", image, err, out)
	}
	t.Cleanup(func() { testimage.Untag(context.Background(), image, pinned) })

	fn := startFnServer(t, fnBin)
	merc := &peerSide{name: "Mercator", url: c.url, token: c.token, pid: agentPID, self: true,
		hc:         &http.Client{Transport: &http.Transport{TLSClientConfig: c.tlsConfig()}},
		containers: func(fnID string) []string { return runningLabeled(t, "mercator.fn="+fnID, "") }}
	// The same on Mercator with the FDK's per-call log frames off (the
	// function's mercator.dev/log-frames annotation), in an app of its own.
	unframed := *merc
	unframed.name, unframed.app, unframed.annotations = "Mercator, log frames off", "peer-unframed", map[string]any{api.AnnotationLogFrames: "false"}
	sides := []*peerSide{fn, merc, &unframed}
	script := filepath.Join(t.TempDir(), "post.lua")
	if err := os.WriteFile(script, []byte("wrk.method = \"POST\"\nwrk.body = \"{}\"\n"+
		"wrk.headers[\"Content-Type\"] = \"application/json\"\n"+
		"wrk.headers[\"Authorization\"] = \"Bearer "+c.token+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, s := range sides {
		s.appID = s.create(t, "/v2/apps", map[string]any{"name": cmp.Or(s.app, "peer")})
		s.fnID = s.create(t, "/v2/fns", s.fnBody("hot", image, 300))
		s.firstCall(t, s.fnID) // its first container
		s.wrk(t, wrk, script, 8, 3)
	}

	results := map[string][]peerRound{}
	for r := 0; r < rounds; r++ {
		order := slices.Clone(sides)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		rs := map[string]*peerRound{}
		for _, s := range sides {
			rs[s.name] = &peerRound{}
		}
		for _, s := range order {
			id := s.create(t, "/v2/fns", s.fnBody(fmt.Sprintf("first-%d", r), image, 10))
			rs[s.name].first = s.firstCall(t, id)
		}
		for _, s := range order {
			rs[s.name].c1 = s.wrk(t, wrk, script, 1, seconds)
		}
		for _, s := range order {
			ids := s.containers(s.fnID)
			cpu0 := cputime.Take(s.pid, ids)
			rs[s.name].c8 = s.wrk(t, wrk, script, 8, seconds)
			after := s.containers(s.fnID)
			cpu := cputime.Take(s.pid, slices.Compact(slices.Sorted(slices.Values(append(ids, after...))))).Minus(cpu0).Per(max(1, rs[s.name].c8.requests))
			if !s.self {
				cpu.Self = 0
			}
			rs[s.name].containers, rs[s.name].serverCPU, rs[s.name].containerCPU = len(after), cpu.Self+cpu.Process, cpu.Containers
			rs[s.name].daemonCPU = cpu.Dockerd + cpu.Containerd
		}
		for _, s := range sides {
			results[s.name] = append(results[s.name], *rs[s.name])
		}
	}
	if t.Failed() {
		return
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("\nHot calls beside Fn: fn-fdk, an empty call; %d rounds of %d s a phase, interleaved; wrk; Mercator over HTTPS, %s (load average at end: %s)\n",
		rounds, seconds, where, strings.TrimSpace(string(load)))
	var names []string
	var res [][]peerRound
	for _, s := range sides {
		names, res = append(names, s.name), append(res, results[s.name])
	}
	printPeerTable(names, res)
}

// peerRound is one round's figures for one side.
type peerRound struct {
	first                   time.Duration
	c1, c8                  wrkResult
	containers              int
	serverCPU, containerCPU time.Duration // per call at c=8
	daemonCPU               time.Duration // dockerd, containerd and the shims, per call at c=8
}

// printPeerTable prints each figure as a range over the rounds for every
// side, the first (Fn) and then each other with its ratio to the first
// (calls/s: higher is better; latencies and CPU: lower is better), and
// every round's figures.
func printPeerTable(names []string, res [][]peerRound) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
	type fig struct {
		name string
		get  func(peerRound) float64
		show func(float64) string
	}
	dur := func(f func(peerRound) time.Duration) func(peerRound) float64 {
		return func(r peerRound) float64 { return float64(f(r)) }
	}
	showMS := func(v float64) string { return ms(time.Duration(v)) }
	showN := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	showUS := func(v float64) string { return fmt.Sprintf("%.0f µs", v/1000) }
	figs := []fig{
		{"c=1 calls/s", func(r peerRound) float64 { return r.c1.rate }, showN},
		{"c=1 p50", dur(func(r peerRound) time.Duration { return r.c1.p50 }), showMS},
		{"c=1 p99", dur(func(r peerRound) time.Duration { return r.c1.p99 }), showMS},
		{"c=8 calls/s", func(r peerRound) float64 { return r.c8.rate }, showN},
		{"c=8 p50", dur(func(r peerRound) time.Duration { return r.c8.p50 }), showMS},
		{"c=8 p99", dur(func(r peerRound) time.Duration { return r.c8.p99 }), showMS},
		{"c=8 containers", func(r peerRound) float64 { return float64(r.containers) }, showN},
		{"c=8 server CPU/call", dur(func(r peerRound) time.Duration { return r.serverCPU }), showUS},
		{"c=8 container CPU/call", dur(func(r peerRound) time.Duration { return r.containerCPU }), showUS},
		{"c=8 dockerd+containerd CPU/call", dur(func(r peerRound) time.Duration { return r.daemonCPU }), showUS},
		{"first call after create", dur(func(r peerRound) time.Duration { return r.first }), showMS},
	}
	span := func(show func(float64) string, vs []float64) string {
		lo, hi := slices.Min(vs), slices.Max(vs)
		if show(lo) == show(hi) {
			return show(lo)
		}
		return show(lo) + "–" + show(hi)
	}
	showRatio := func(v float64) string { return fmt.Sprintf("%.2f×", v) }
	head, rule := "| | "+names[0], "|---|---"
	for _, n := range names[1:] {
		head, rule = head+" | "+n+" | ×"+names[0], rule+"|---|---"
	}
	fmt.Printf("%s | by round (%s) |\n%s|---|\n", head, strings.Join(names, " / "), rule)
	for _, f := range figs {
		cols := make([][]float64, len(res))
		for k := range res {
			for _, r := range res[k] {
				cols[k] = append(cols[k], f.get(r))
			}
		}
		line := "| " + f.name + " | " + span(f.show, cols[0])
		for k := 1; k < len(res); k++ {
			var ratio []float64
			for i := range cols[k] {
				ratio = append(ratio, cols[k][i]/cols[0][i])
			}
			line += " | " + span(f.show, cols[k]) + " | " + span(showRatio, ratio)
		}
		var rounds []string
		for i := range cols[0] {
			var vs []string
			for k := range cols {
				vs = append(vs, f.show(cols[k][i]))
			}
			rounds = append(rounds, strings.Join(vs, " / "))
		}
		fmt.Println(line + " | " + strings.Join(rounds, "; ") + " |")
	}
	fmt.Println()
}

// peerSide is one server under test, spoken to through Fn's v2 API.
type peerSide struct {
	name, url, token string
	pid              int  // the server's process (Mercator's: the agent)
	self             bool // this test process is part of the server (Mercator's control plane)
	hc               *http.Client
	containers       func(fnID string) []string // the function's running containers
	appID, fnID      string
	app              string         // the app's name; "peer" if empty
	annotations      map[string]any // on its functions
}

// fnBody is the Fn v2 function this side creates: the same for every side
// but for its annotations.
func (s *peerSide) fnBody(name, image string, idle int) map[string]any {
	body := map[string]any{"app_id": s.appID, "name": name, "image": image, "memory": 128, "idle_timeout": idle}
	if s.annotations != nil {
		body["annotations"] = s.annotations
	}
	return body
}

// create POSTs an Fn v2 object and returns its ID.
func (s *peerSide) create(t *testing.T, path string, body map[string]any) string {
	t.Helper()
	raw, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, s.url+path, bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.hc.Do(req)
	if err != nil {
		t.Fatalf("%s: POST %s: %v", s.name, path, err)
	}
	defer resp.Body.Close()
	var out struct{ ID string }
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(data, &out) != nil || out.ID == "" {
		t.Fatalf("%s: POST %s: %d %s", s.name, path, resp.StatusCode, data)
	}
	return out.ID
}

// firstCall invokes a function once and returns the call's latency.
func (s *peerSide) firstCall(t *testing.T, fnID string) time.Duration {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.url+"/invoke/"+fnID, strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.token)
	t0 := time.Now()
	resp, err := s.hc.Do(req)
	if err != nil {
		t.Fatalf("%s: invoke %s: %v", s.name, fnID, err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(t0)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: invoke %s: %d %s", s.name, fnID, resp.StatusCode, data)
	}
	return took
}

// wrk runs wrk against the side's hot function at conns connections for
// secs seconds; a call that failed or answered other than 2xx fails the test.
func (s *peerSide) wrk(t *testing.T, bin, script string, conns, secs int) wrkResult {
	t.Helper()
	out, err := exec.Command(bin, "-t", strconv.Itoa(min(conns, 2)), "-c", strconv.Itoa(conns), "-d", strconv.Itoa(secs)+"s",
		"--timeout", "10s", "--latency", "-s", script, s.url+"/invoke/"+s.fnID).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: wrk: %v\n%s", s.name, err, out)
	}
	r, err := parseWrk(string(out))
	if err != nil {
		t.Fatalf("%s: %v\n%s", s.name, err, out)
	}
	return r
}

// wrkResult is what the benchmark reads from wrk's report.
type wrkResult struct {
	requests int
	rate     float64
	p50, p99 time.Duration
}

// parseWrk reads wrk's --latency report; any failed call is an error.
func parseWrk(out string) (wrkResult, error) {
	var r wrkResult
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && (f[0] == "50%" || f[0] == "99%"):
			d, err := parseWrkDuration(f[1])
			if err != nil {
				return r, err
			}
			if f[0] == "50%" {
				r.p50 = d
			} else {
				r.p99 = d
			}
		case len(f) >= 3 && f[1] == "requests" && f[2] == "in":
			r.requests, _ = strconv.Atoi(f[0])
		case len(f) == 2 && f[0] == "Requests/sec:":
			r.rate, _ = strconv.ParseFloat(f[1], 64)
		case strings.HasPrefix(sc.Text(), "  Non-2xx") || strings.HasPrefix(sc.Text(), "  Socket errors"):
			return r, fmt.Errorf("wrk: calls failed: %s", strings.TrimSpace(sc.Text()))
		}
	}
	if r.requests == 0 || r.rate == 0 || r.p50 == 0 {
		return r, fmt.Errorf("wrk: no requests, rate or latency in its report")
	}
	return r, nil
}

// parseWrkDuration reads wrk's latency figures: 706.00us, 1.13ms, 2.01s.
func parseWrkDuration(s string) (time.Duration, error) {
	for _, u := range []struct {
		suffix string
		unit   time.Duration
	}{{"us", time.Microsecond}, {"ms", time.Millisecond}, {"m", time.Minute}, {"s", time.Second}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("wrk: latency %q: %v", s, err)
			}
			return time.Duration(f * float64(u.unit)), nil
		}
	}
	return 0, fmt.Errorf("wrk: latency %q has no unit", s)
}

// startFnServer runs fnserver on a free port with an SQLite store and its
// own container label, waits for /version, and stops it (SIGTERM, which
// has Fn remove its containers; the rest are removed here) at cleanup.
func startFnServer(t *testing.T, bin string) *peerSide {
	t.Helper()
	dir := t.TempDir()
	ports := freePorts(t, 2)
	label := "mercator-peer-bench-" + strconv.Itoa(os.Getpid())
	logPath := filepath.Join(dir, "fnserver.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "FN_PORT="+strconv.Itoa(ports[0]), "FN_GRPC_PORT="+strconv.Itoa(ports[1]),
		"FN_DB_URL=sqlite3://"+filepath.Join(dir, "fn.db"), "FN_LOG_LEVEL=error", "FN_CONTAINER_LABEL_TAG="+label,
		"FN_IOFS_PATH="+dir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start fnserver: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logFile.Close(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		for _, id := range runningLabeled(t, "fn-agent-classifier="+label, "") {
			exec.Command("docker", "rm", "-f", id).Run()
		}
	})
	s := &peerSide{name: "Fn", url: "http://127.0.0.1:" + strconv.Itoa(ports[0]), pid: cmd.Process.Pid, hc: &http.Client{},
		containers: func(fnID string) []string { return runningLabeled(t, "fn-agent-classifier="+label, "FN_FN_ID="+fnID) }}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := s.hc.Get(s.url + "/version")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		select {
		case <-done:
			data, _ := os.ReadFile(logPath)
			t.Fatalf("fnserver exited:\n%s", data)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("fnserver did not answer /version: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runningLabeled lists the running containers with a label (k=v) and,
// when env is not empty, that environment entry.
func runningLabeled(t *testing.T, label, env string) []string {
	t.Helper()
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	list, err := cli.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", label), filters.Arg("status", "running"))})
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	var ids []string
	for _, ct := range list {
		if env != "" {
			info, err := cli.ContainerInspect(ctx, ct.ID)
			if err != nil || info.Config == nil || !slices.Contains(info.Config.Env, env) {
				continue
			}
		}
		ids = append(ids, ct.ID)
	}
	return ids
}

// envPositive reads a positive whole number from the environment, or def.
func envPositive(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// localAgentFromFlags is the agent `mercator server --local-agent node`
// runs given `mercator agent` flags, each passed as the server's
// --agent-… flag.
func localAgentFromFlags(t *testing.T, node string, agentFlags []string) *daemon.AgentOptions {
	t.Helper()
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	options := daemon.LocalAgentFlags(fs)
	var args []string
	for _, f := range agentFlags {
		if name, ok := strings.CutPrefix(f, "--"); ok {
			f = "--" + daemon.LocalAgentPrefix + name
		}
		args = append(args, f)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	a, err := options()
	if err != nil {
		t.Fatal(err)
	}
	a.NodeID = node
	return &a
}
