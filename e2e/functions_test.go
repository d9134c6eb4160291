package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/fnagent/outputrelay"
	"github.com/mercator/mercator/internal/registrytest"
	"github.com/mercator/mercator/internal/testimage"
)

// Functions end to end: the Fn-compatible API on a real control plane,
// calls placed on real agents (in this process, or in their own), hot
// containers of real FDK images on the local Docker daemon.

// deployHello creates an app and a function, by default the sample
// function examples/fn-hello.
func (c *cluster) deployHello(appName string, fn api.Fn) (api.App, api.Fn) {
	c.t.Helper()
	app, err := c.client.AppByName(c.ctx, appName)
	if err != nil {
		if app, err = c.client.CreateApp(c.ctx, api.App{Name: appName}); err != nil {
			c.t.Fatalf("create app: %v", err)
		}
	}
	if fn.Image == "" {
		fn.Image = c.publish("fn-hello")
	}
	if fn.Name == "" {
		fn.Name = "hello"
	}
	fn.AppID = app.ID
	created, err := c.client.CreateFn(c.ctx, fn)
	if err != nil {
		c.t.Fatalf("create fn: %v", err)
	}
	return app, created
}

// invoke calls a function and returns its status and body; an error of
// the platform fails the test.
func (c *cluster) invoke(fnID, body string) (int, string) {
	c.t.Helper()
	var out bytes.Buffer
	res, err := c.client.Invoke(c.ctx, fnID, strings.NewReader(body), http.Header{"Content-Type": {"application/json"}}, &out)
	if err != nil {
		c.t.Fatalf("invoke %s: %v", fnID, err)
	}
	return res.Status, out.String()
}

// fnContainers lists the daemon's containers of a function as node IDs.
func fnContainers(t testing.TB, fnID string) []string {
	out, err := execOutput("docker", "ps", "--format", `{{.Label "mercator.node"}}`, "--filter", "label=mercator.fn="+fnID)
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	return strings.Fields(out)
}

// TestFunctionHotContainer: a function deployed through the API is called
// through the control plane into one container on the agent, which stays
// hot: the calls after the first reuse it.
func TestFunctionHotContainer(t *testing.T) {
	c := startCluster(t)
	nodeID := c.startAgent("n")
	_, fn := c.deployHello("hot", api.Fn{Image: c.publish("fn-fdk"), IdleTimeout: 120})
	var pids []float64
	for i := 0; i < 5; i++ {
		status, body := c.invoke(fn.ID, `{}`)
		var resp struct {
			PID   float64 `json:"pid"`
			Calls float64 `json:"calls"`
		}
		if status != 200 || json.Unmarshal([]byte(body), &resp) != nil {
			t.Fatalf("call %d = %d %q", i, status, body)
		}
		if resp.Calls != float64(i+1) {
			t.Errorf("call %d was the container's call %v: not the same hot container", i, resp.Calls)
		}
		pids = append(pids, resp.PID)
	}
	if got := fnContainers(t, fn.ID); len(got) != 1 || got[0] != nodeID {
		t.Errorf("containers of the function: %v, want one on %s", got, nodeID)
	}
	// The function's containers are not the node's workloads: no run or
	// attempt appears for them.
	runs, err := c.client.ListRuns(c.ctx, client.ListRunsOptions{})
	if err != nil || len(runs.Runs) != 0 {
		t.Errorf("runs after function calls: %+v, %v", runs.Runs, err)
	}
}

// TestFunctionAgentInItsOwnProcess: the agent is the mercator binary, run
// as `mercator agent`; the call reaches it only over its outbound session.
func TestFunctionAgentInItsOwnProcess(t *testing.T) {
	c := startCluster(t)
	p := c.startProcessAgent("proc", "--fn-memory", "1GiB")
	_, fn := c.deployHello("proc", api.Fn{})
	status, body := c.invoke(fn.ID, `{"name":"process"}`)
	if status != 200 || !strings.Contains(body, "Hello, process") {
		t.Fatalf("invoke = %d %q", status, body)
	}
	if got := fnContainers(t, fn.ID); len(got) != 1 || got[0] != p.nodeID {
		t.Errorf("containers: %v, want one on %s", got, p.nodeID)
	}
	// The Fn CLI's way: the function's invoke endpoint annotation.
	var endpoint string
	json.Unmarshal(fn.Annotations[api.AnnotationInvokeEndpoint], &endpoint)
	var out bytes.Buffer
	res, err := c.client.InvokeURL(c.ctx, http.MethodPost, endpoint, strings.NewReader(`{"name":"endpoint"}`), nil, &out)
	if err != nil || res.Status != 200 || !strings.Contains(out.String(), "Hello, endpoint") {
		t.Fatalf("invoke by endpoint = %+v %q %v", res, out.String(), err)
	}

	// Built static, the agent is its own output relay (--fn-output-relay
	// auto): a function's container runs its command through it, and the
	// output reaches the agent through pipes, each call's log exact.
	_, logged := c.deployHello("proclogs", api.Fn{Image: c.publish("fn-fdk")})
	mark := sha256Hex([]byte(time.Now().String()))[:12]
	_, errOut, code := c.mercatorExit(`{"log":["relayed `+mark+`"]}`, "fn", "invoke", "proclogs", "hello", "--content-type", "application/json", "--call-id")
	callID, ok := strings.CutPrefix(strings.TrimSpace(errOut), "call ")
	if code != 0 || !ok {
		t.Fatalf("fn invoke --call-id: exit %d, stderr %q", code, errOut)
	}
	// The node says so in its facts, which `mercator node get` shows.
	c.waitFor("the node's facts say its function output is relayed", func() bool {
		n, err := c.client.GetNode(c.ctx, p.nodeID)
		if err != nil || n.Facts == nil {
			return false
		}
		fns, _ := (*n.Facts)["functions"].(map[string]any)
		return fns["output_relay"] == true
	})
	if out := c.mercator("node", "get", p.nodeID); !strings.Contains(out, "output through the agent's relay") {
		t.Errorf("node get says nothing of the relay:\n%s", out)
	}
	entry, err := execOutput("docker", "ps", "--format", "{{.Command}}", "--no-trunc", "--filter", "label=mercator.fn="+logged.ID)
	if err != nil || !strings.Contains(entry, outputrelay.InContainer+" "+outputrelay.Arg) {
		t.Fatalf("the function's container runs %q (%v); want its command through the relay", entry, err)
	}
	want := "relayed " + mark + "\nrelayed " + mark + "\n" // the FDK test image prints to stderr, then stdout
	var log string
	c.waitFor("the call's log through the relay", func() bool {
		log, err = c.client.CallLog(c.ctx, logged.ID, callID)
		return err == nil && log == want
	})
}

// TestFunctionsSpreadAndSpill: with two agents, functions spread over both
// (each function's calls go to the node rendezvous hashing ranks first),
// and a function at its per-node concurrency cap spills to the other node.
//
// Function IDs are the control plane's to choose, node IDs the test's: two
// functions are deployed first, then a pair of node IDs is searched (a
// bounded loop) that the first function ranks a, b and the second b, a, so
// both nodes must serve a call and no run depends on luck.
func TestFunctionsSpreadAndSpill(t *testing.T) {
	c := startCluster(t)
	image := c.publish("fn-fdk")
	_, f1 := c.deployHello("spread", api.Fn{Name: "f1", Image: image})
	_, f2 := c.deployHello("spread", api.Fn{Name: "f2", Image: image})
	// Two nodes the functions order oppositely: any pair of IDs is such a
	// pair with probability 1/2, and all 16 candidates ordered alike by both
	// functions (no pair found) has probability 1/16!.
	var cands []string
	for i := range 16 {
		cands = append(cands, fmt.Sprintf("%s-%d", uniqueNodeID(t, "n"), i))
	}
	a, b := "", ""
pairs:
	for i, x := range cands {
		for _, y := range cands[i+1:] {
			if (fnRankScore(f1.ID, x) > fnRankScore(f1.ID, y)) != (fnRankScore(f2.ID, x) > fnRankScore(f2.ID, y)) {
				a, b = x, y
				if fnRankScore(f1.ID, y) > fnRankScore(f1.ID, x) {
					a, b = y, x
				}
				break pairs
			}
		}
	}
	if a == "" {
		t.Fatalf("no two of %v are ranked first one by %s and the other by %s", cands, f1.ID, f2.ID)
	}
	for _, id := range []string{a, b} {
		inv, err := c.client.InviteNode(c.ctx, id, 0)
		if err != nil {
			t.Fatalf("invite %s: %v", id, err)
		}
		c.runAgent(id, inv.Token)
	}
	// Spread: each function's call lands on the node it ranks first.
	for _, want := range []struct {
		fn   api.Fn
		node string
	}{{f1, a}, {f2, b}} {
		if status, body := c.invoke(want.fn.ID, `{}`); status != 200 {
			t.Fatalf("invoke %s = %d %q", want.fn.Name, status, body)
		}
		if got := fnContainers(t, want.fn.ID); len(got) != 1 || got[0] != want.node {
			t.Fatalf("%s ran on %v, want only %s, the node rendezvous hashing ranks first (or fnRankScore no longer matches placement's hash)", want.fn.Name, got, want.node)
		}
	}
	// Spill: one container per node at most; three slow calls at once.
	_, fn := c.deployHello("spill", api.Fn{Name: "slow", Image: image, MaxConcurrency: 1})
	if status, _ := c.invoke(fn.ID, `{}`); status != 200 { // warm the first node
		t.Fatalf("warm-up = %d", status)
	}
	var wg sync.WaitGroup
	results := make([]int, 3)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			res, err := c.client.Invoke(c.ctx, fn.ID, strings.NewReader(`{"sleep_ms":1500}`), nil, &out)
			if err != nil {
				results[i] = -1
				t.Logf("call %d: %v", i, err)
				return
			}
			results[i] = res.Status
		}()
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	got := fnContainers(t, fn.ID)
	if len(got) != 2 || got[0] == got[1] {
		t.Errorf("containers of the capped function: %v, want one on each node", got)
	}
	ok := 0
	for _, s := range results {
		if s == 200 {
			ok++
		}
	}
	// Two ran at once, one per node; the third queued on the last node
	// tried, or was refused as busy: both are the contract.
	if ok < 2 {
		t.Errorf("results %v: want at least the two that fit to succeed", results)
	}
}

// TestFunctionAgentKilledDuringCalls: an agent process killed while calls
// run on it: every caller gets an answer (the result, or an error), none
// hangs; calls afterwards go to the node that is left.
func TestFunctionAgentKilledDuringCalls(t *testing.T) {
	c := startCluster(t)
	image := c.publish("fn-fdk")
	p := c.startProcessAgent("doomed", "--fn-memory", "1GiB")
	_, fn := c.deployHello("kill", api.Fn{Image: image, Timeout: 60})
	if status, _ := c.invoke(fn.ID, `{}`); status != 200 {
		t.Fatal("warm-up failed")
	}
	type result struct {
		status int
		err    error
		took   time.Duration
	}
	results := make(chan result, 6)
	for i := 0; i < 6; i++ {
		go func() {
			start := time.Now()
			ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
			defer cancel()
			res, err := c.client.Invoke(ctx, fn.ID, strings.NewReader(`{"sleep_ms":3000}`), nil, io.Discard)
			results <- result{res.Status, err, time.Since(start)}
		}()
	}
	time.Sleep(time.Second) // the calls are in the containers
	p.kill()
	for i := 0; i < 6; i++ {
		r := <-results
		if r.took > 70*time.Second {
			t.Errorf("a call took %v: it hung until well past its deadline", r.took)
		}
		t.Logf("call ended: status %d err %v after %v", r.status, r.err, r.took.Round(time.Millisecond))
	}
	// Another node takes the function's calls from now on.
	c.startAgent("survivor")
	c.waitFor("the killed node to leave the fleet", func() bool {
		n, err := c.client.GetNode(c.ctx, p.nodeID)
		return err == nil && n.Status != "ready"
	})
	if status, body := c.invoke(fn.ID, `{}`); status != 200 {
		t.Fatalf("after the kill = %d %q", status, body)
	}
}

// TestFunctionsFnCLIContract drives the API the way the Fn CLI does, with
// its request bodies, and checks the shapes it relies on: create app,
// create function, create trigger, invoke by the invoke endpoint and by
// the trigger's URL, update, delete.
func TestFunctionsFnCLIContract(t *testing.T) {
	c := startCluster(t)
	c.startAgent("n")
	image := c.publish("fn-hello")
	call := func(method, path string, body any, want int) map[string]any {
		t.Helper()
		var r io.Reader
		if body != nil {
			raw, _ := json.Marshal(body)
			r = bytes.NewReader(raw)
		}
		req, _ := http.NewRequest(method, c.url+path, r)
		req.Header.Set("Authorization", "Bearer "+c.token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("User-Agent", "Fn-Client/0.6.x")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s = %d %s, want %d", method, path, resp.StatusCode, raw, want)
		}
		var out map[string]any
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatalf("%s %s: %v in %s", method, path, err, raw)
			}
		}
		return out
	}
	has := func(what string, obj map[string]any, fields ...string) {
		t.Helper()
		for _, f := range fields {
			if _, ok := obj[f]; !ok {
				t.Errorf("%s lacks %q: %v", what, f, obj)
			}
		}
	}
	// fn create app clitest
	app := call("POST", "/v2/apps", map[string]any{"name": "clitest"}, 200)
	has("app", app, "id", "name", "created_at", "updated_at")
	appID := app["id"].(string)
	// The CLI finds apps by name.
	list := call("GET", "/v2/apps?name=clitest", nil, 200)
	if items, _ := list["items"].([]any); len(items) != 1 {
		t.Fatalf("apps by name = %v", list)
	}
	// fn create function clitest hello IMAGE (the CLI sends its own fields,
	// some Mercator does not know, which are ignored as Fn ignores them).
	fn := call("POST", "/v2/fns", map[string]any{"name": "hello", "app_id": appID, "image": image, "memory": 128, "timeout": 30,
		"idle_timeout": 30, "annotations": map[string]any{}, "format": "http-stream"}, 200)
	has("fn", fn, "id", "name", "app_id", "image", "memory", "timeout", "idle_timeout", "annotations", "created_at", "updated_at")
	fnID := fn["id"].(string)
	endpoint, _ := fn["annotations"].(map[string]any)[api.AnnotationInvokeEndpoint].(string)
	if endpoint != c.url+"/invoke/"+fnID {
		t.Errorf("invoke endpoint = %q", endpoint)
	}
	fns := call("GET", "/v2/fns?app_id="+appID+"&name=hello", nil, 200)
	if items, _ := fns["items"].([]any); len(items) != 1 {
		t.Fatalf("fns by name = %v", fns)
	}
	// fn create trigger clitest hello hello --type http --source /hello
	tr := call("POST", "/v2/triggers", map[string]any{"name": "hello", "app_id": appID, "fn_id": fnID, "type": "http", "source": "/hello"}, 200)
	has("trigger", tr, "id", "name", "app_id", "fn_id", "type", "source", "annotations", "created_at", "updated_at")
	trURL, _ := tr["annotations"].(map[string]any)[api.AnnotationTriggerEndpoint].(string)
	if trURL != c.url+"/t/clitest/hello" {
		t.Errorf("trigger endpoint = %q", trURL)
	}
	// fn invoke clitest hello: POST to the invoke endpoint.
	invoke := func(method, url, body string) (int, string, http.Header) {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+c.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw), resp.Header
	}
	status, body, h := invoke("POST", endpoint, `{"name":"CLI"}`)
	if status != 200 || !strings.Contains(body, "Hello, CLI") || h.Get("Fn-Call-Id") == "" || h.Get("Content-Type") != "application/json" {
		t.Fatalf("invoke = %d %q %v", status, body, h)
	}
	// curl the trigger.
	status, body, _ = invoke("POST", trURL, `{"name":"trigger"}`)
	if status != 200 || !strings.Contains(body, "Hello, trigger") {
		t.Fatalf("trigger = %d %q", status, body)
	}
	// fn update function clitest hello --memory 256 --config K=V
	up := call("PUT", "/v2/fns/"+fnID, map[string]any{"memory": 256, "config": map[string]string{"K": "V"}}, 200)
	if up["memory"].(float64) != 256 || up["config"].(map[string]any)["K"] != "V" {
		t.Errorf("updated = %v", up)
	}
	status, body, _ = invoke("POST", endpoint, `{"name":"updated"}`)
	if status != 200 || !strings.Contains(body, "Hello, updated") {
		t.Fatalf("invoke after update = %d %q", status, body)
	}
	// Errors are Fn's body.
	e := call("GET", "/v2/fns/nope", nil, 404)
	if e["message"] != "Fn not found" {
		t.Errorf("error body = %v", e)
	}
	// fn delete trigger / function / app
	call("DELETE", "/v2/triggers/"+tr["id"].(string), nil, 204)
	call("DELETE", "/v2/fns/"+fnID, nil, 204)
	call("DELETE", "/v2/apps/"+appID, nil, 204)
	call("GET", "/v2/apps/"+appID, nil, 404)
}

// TestDurableCallsSurviveControlPlaneRestart: detached calls stored before
// a restart of the control plane are delivered after it, at least once,
// and their status, result and logs are readable by call ID.
func TestDurableCallsSurviveControlPlaneRestart(t *testing.T) {
	cp := startRestartable(t)
	image, err := testimagePublish(cp.ctx, "fn-fdk", cp.registry)
	if err != nil {
		t.Fatal(err)
	}
	cl := client.New(cp.url, cp.token, nil)
	app, err := cl.CreateApp(cp.ctx, api.App{Name: "durable"})
	if err != nil {
		t.Fatal(err)
	}
	fn, err := cl.CreateFn(cp.ctx, api.Fn{Name: "f", AppID: app.ID, Image: image, Timeout: 10})
	if err != nil {
		t.Fatal(err)
	}
	// Calls stored while no node can take them wait in the queue...
	var ids []string
	for i := 0; i < 4; i++ {
		id, err := cl.InvokeDetached(cp.ctx, fn.ID, strings.NewReader(fmt.Sprintf(`{"log":["call %d"]}`, i)), nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// ... through a restart of the control plane ...
	cp.restart()
	cp.startAgent("n")
	cl = client.New(cp.url, cp.token, nil)
	// ... and are delivered once a node is there.
	for i, id := range ids {
		var call api.FnCall
		deadline := time.Now().Add(2 * time.Minute)
		for {
			call, err = cl.GetCall(cp.ctx, fn.ID, id)
			if err == nil && (call.Status == api.CallSuccess || call.Status == api.CallError) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("call %s still %+v (%v)", id, call, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if call.Status != api.CallSuccess || call.ResponseStatus != 200 || call.Attempts < 1 {
			t.Fatalf("call %s = %+v", id, call)
		}
		log, err := cl.CallLog(cp.ctx, fn.ID, id)
		if err != nil || !strings.Contains(log, fmt.Sprintf("call %d", i)) {
			t.Errorf("call %s log = %q, %v", id, log, err)
		}
		var out bytes.Buffer
		res, err := cl.CallResult(cp.ctx, fn.ID, id, &out)
		if err != nil || res.Status != 200 || !strings.Contains(out.String(), `"calls"`) {
			t.Errorf("call %s result = %+v %q %v", id, res, out.String(), err)
		}
	}
	// A call running when the control plane stops is delivered again
	// after the restart (at least once).
	id, err := cl.InvokeDetached(cp.ctx, fn.ID, strings.NewReader(`{"sleep_ms":3000}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		call, err := cl.GetCall(cp.ctx, fn.ID, id)
		if err == nil && call.Status == api.CallRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("call never ran: %+v %v", call, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cp.restart()
	cl = client.New(cp.url, cp.token, nil)
	deadline = time.Now().Add(2 * time.Minute)
	for {
		call, err := cl.GetCall(cp.ctx, fn.ID, id)
		if err == nil && call.Status == api.CallSuccess {
			if call.Attempts < 2 {
				t.Errorf("the interrupted call = %+v, want a second delivery", call)
			}
			break
		}
		if err == nil && call.Status == api.CallError {
			t.Fatalf("the interrupted call failed: %+v", call)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the interrupted call is still %+v (%v)", call, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// restartable is a control plane that can be stopped and started again on
// the same address and data, with in-process agents.
type restartable struct {
	t        *testing.T
	ctx      context.Context
	dataDir  string
	addr     string
	url      string
	token    string
	registry string
	stopCP   func()
	agents   []func()
}

func startRestartable(t *testing.T) *restartable {
	ctx, cancel := context.WithCancel(context.Background())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r := &restartable{t: t, ctx: ctx, dataDir: t.TempDir(), addr: addr, url: "http://" + addr, registry: registrytest.Start(t)}
	r.start()
	t.Cleanup(func() {
		for _, stop := range r.agents {
			stop()
		}
		r.stopCP()
		cancel()
	})
	return r
}

func (r *restartable) start() {
	ctx, cancel := context.WithCancel(r.ctx)
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- daemon.RunServer(ctx, daemon.ServerOptions{
			DataDir: r.dataDir, Listen: r.addr, Logger: testLogger(r.t).With("c", "server"), InsecureHTTP: true,
			Config: controlplane.Config{Lease: 10 * time.Second, KeepAlive: time.Second, ReconcileEvery: time.Second},
			Ready:  func(url, tok string) { ready <- tok },
		})
	}()
	select {
	case tok := <-ready:
		data, err := os.ReadFile(tok)
		if err != nil {
			r.t.Fatal(err)
		}
		r.token = strings.TrimSpace(string(data))
	case err := <-done:
		r.t.Fatalf("control plane did not start: %v", err)
	}
	r.stopCP = func() {
		cancel()
		<-done
	}
}

func (r *restartable) restart() {
	r.stopCP()
	r.start()
}

func (r *restartable) startAgent(base string) {
	nodeID := uniqueNodeID(r.t, base)
	cl := client.New(r.url, r.token, nil)
	inv, err := cl.InviteNode(r.ctx, nodeID, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		daemon.RunAgent(ctx, daemon.AgentOptions{ControlPlaneURL: r.url, NodeID: nodeID, StateDir: filepath.Join(r.dataDir, "agent-"+nodeID),
			Invitation: inv.Token, Heartbeat: 500 * time.Millisecond, Logger: testLogger(r.t).With("c", "agent")})
	}()
	r.agents = append(r.agents, func() {
		cancel()
		<-done
		removeContainers(r.t, []string{nodeID})
	})
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := cl.GetNode(r.ctx, nodeID)
		if err == nil && n.Status == "ready" && n.Facts != nil && (*n.Facts)["functions"] != nil {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("agent %s not ready: %+v %v", nodeID, n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testimagePublish publishes testdata/images/NAME (or examples/NAME).
func testimagePublish(ctx context.Context, name, registry string) (string, error) {
	root, err := testimage.Root()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "examples", name)
	if _, err := os.Stat(dir); err != nil {
		dir = filepath.Join(root, "testdata", "images", name)
	}
	return testimage.Publish(ctx, dir, registry)
}

// TestFunctionAcrossReplicas: two control-plane replicas on one
// PostgreSQL database; the agent's session is on replica B and the caller
// on replica A. The invoke command crosses replicas as a signal, and the
// agent brings the call's bodies to replica A, which holds the caller; a
// question for a synchronous call's log crosses the same way.
func TestFunctionAcrossReplicas(t *testing.T) {
	dsn := postgresDSN(t)
	c := startCluster(t) // for the registry and the images
	a, b := startReplica(t, dsn), startReplica(t, dsn)
	nodeID := uniqueNodeID(t, "rep")
	inv, err := a.client.InviteNode(c.ctx, nodeID, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	agentDone := make(chan error, 1)
	go func() {
		agentDone <- daemon.RunAgent(ctx, daemon.AgentOptions{ControlPlaneURL: b.url, NodeID: nodeID,
			StateDir: filepath.Join(t.TempDir(), "agent"), Invitation: inv.Token, Heartbeat: time.Second, Logger: testLogger(t)})
	}()
	t.Cleanup(func() { cancel(); <-agentDone; removeContainers(t, []string{nodeID}) })
	c.waitFor("node ready with its function share, seen from replica A", func() bool {
		n, err := a.client.GetNode(c.ctx, nodeID)
		return err == nil && n.Status == api.NodeReady && n.Facts != nil && (*n.Facts)["functions"] != nil
	})
	app, err := a.client.CreateApp(c.ctx, api.App{Name: "replicated"})
	if err != nil {
		t.Fatal(err)
	}
	fn, err := a.client.CreateFn(c.ctx, api.Fn{Name: "hello", AppID: app.ID, Image: c.publish("fn-hello")})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		var out bytes.Buffer
		res, err := a.client.Invoke(c.ctx, fn.ID, strings.NewReader(`{"name":"A"}`), nil, &out)
		if err != nil || res.Status != 200 || !strings.Contains(out.String(), "Hello, A") {
			t.Fatalf("invoke on A, session on B: %+v %q %v", res, out.String(), err)
		}
	}
	// A large body, which the agent streams from replica A.
	big := `{"name":"` + strings.Repeat("x", 200<<10) + `"}`
	var out bytes.Buffer
	res, err := a.client.Invoke(c.ctx, fn.ID, strings.NewReader(big), nil, &out)
	if err != nil || res.Status != 200 || out.Len() < 200<<10 {
		t.Fatalf("large invoke across replicas: %+v %d bytes %v", res, out.Len(), err)
	}
	// A synchronous call's log, read through either replica: A asks the
	// node through B, which holds its session, and the answer comes back
	// to A; B asks it directly.
	out.Reset()
	res, err = a.client.Invoke(c.ctx, fn.ID, strings.NewReader(`{"name":"logged"}`), nil, &out)
	if err != nil || res.Status != 200 || res.CallID == "" {
		t.Fatalf("invoke to read the log of: %+v %q %v", res, out.String(), err)
	}
	for name, r := range map[string]*replicaProc{"A": a, "B": b} {
		c.waitFor("the call's log through replica "+name, func() bool {
			log, err := r.client.CallLog(c.ctx, fn.ID, res.CallID)
			return err == nil && strings.Contains(log, "greeting logged (call "+res.CallID+")")
		})
	}
}

// fnRankScore is a node's rendezvous weight for a function, as the control
// plane's function placement documents and computes it (hrwScore in package
// controlplane): FNV-1a of the function ID, a zero byte and the node ID,
// then splitmix64's finalizer. It is written out here because the test
// needs node IDs each function ranks first; TestFunctionsSpreadAndSpill
// fails if it ever disagrees with where calls land.
func fnRankScore(fnID, nodeID string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(fnID))
	h.Write([]byte{0})
	h.Write([]byte(nodeID))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
