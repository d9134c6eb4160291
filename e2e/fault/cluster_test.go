package fault

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	dockerclient "github.com/docker/docker/client"
	_ "modernc.org/sqlite" // the control plane's store, read back for the event table

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/internal/faultproxy"
	"github.com/mercator/mercator/internal/registrytest"
	"github.com/mercator/mercator/internal/testimage"
	"github.com/mercator/mercator/nodeagent"
)

// cluster is one control-plane process, its agents (each a process behind
// its own fault proxy), a loopback registry holding the workload image, and
// the Docker daemon the agents drive.
type cluster struct {
	t      *testing.T
	rng    *rand.Rand
	dir    string
	id     string // short, unique: the stem of this cluster's node IDs
	listen string // the control plane's fixed address, kept across restarts
	url    string
	token  string
	client *client.Client
	lease  time.Duration

	server       *proc
	serverLog    string
	incarnations []incarnation

	registry string
	workload string

	dockerHost string // "" for the environment's daemon
	docker     *dockerclient.Client

	agents []*agent
	sum    *summary
}

// incarnation is one life of the control-plane process.
type incarnation struct {
	start, end time.Time
	// applied is mercator_node_events_total{outcome="applied"} as last
	// scraped before the process was killed (scraped says whether that
	// worked): a lower bound of what that life applied.
	applied float64
	scraped bool
}

type clusterOptions struct {
	lease      time.Duration
	dockerHost string
}

func newCluster(t *testing.T, o clusterOptions) *cluster {
	t.Helper()
	if o.lease == 0 {
		o.lease = 5 * time.Second
	}
	// Logs and state outlive a failed test (and every test with
	// MERCATOR_TEST_LOG set), so a fault that broke something can be read
	// about afterwards.
	dir, err := os.MkdirTemp("", "mercator-fault-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("MERCATOR_TEST_LOG") != "" {
			t.Logf("logs and state kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	c := &cluster{
		t: t, rng: rng(t), dir: dir, lease: o.lease, dockerHost: o.dockerHost,
		id:  fmt.Sprintf("f%06x", time.Now().UnixNano()/1000%0xffffff),
		sum: newSummary(t.Name()),
	}
	opts := []dockerclient.Opt{dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation()}
	if o.dockerHost != "" {
		opts = append(opts, dockerclient.WithHost(o.dockerHost))
	}
	if c.docker, err = dockerclient.NewClientWithOpts(opts...); err != nil {
		t.Fatal(err)
	}
	c.registry = registrytest.Start(t)
	ctx, cancel := withTimeout(3 * time.Minute)
	defer cancel()
	if c.workload, err = testimage.Publish(ctx, testimage.Workload, c.registry); err != nil {
		t.Fatalf("publish the workload image: %v", err)
	}
	c.listen = freeAddr(t)
	c.serverLog = filepath.Join(dir, "server.log")
	t.Cleanup(c.cleanup)
	c.startServer()
	data, err := os.ReadFile(filepath.Join(dir, "server", "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	c.token = strings.TrimSpace(string(data))
	c.client = client.New(c.url, c.token, nil)
	return c
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (c *cluster) cleanup() {
	for _, a := range c.agents {
		if a.proc != nil {
			a.proc.kill(c.t)
		}
		a.proxy.Close()
	}
	if c.server != nil {
		c.server.stop(c.t, 10*time.Second)
	}
	var nodes []string
	for _, a := range c.agents {
		nodes = append(nodes, a.node)
	}
	removeContainers(c.docker, nodes)
	c.docker.Close()
	logs := []string{c.serverLog}
	for _, a := range c.agents {
		logs = append(logs, a.log)
	}
	for _, l := range logs {
		for _, line := range scanLog(l) {
			c.t.Errorf("%s: %s", filepath.Base(l), line)
		}
	}
	if c.t.Failed() {
		for _, l := range logs {
			c.t.Logf("----- last lines of %s:\n%s", l, tail(l, 40))
		}
	}
}

// startServer starts the control plane on c.listen and waits until it
// answers.
func (c *cluster) startServer() {
	c.t.Helper()
	c.server = startProc(c.t, "server", c.serverLog, nil, "server",
		"--listen", c.listen, "--data-dir", filepath.Join(c.dir, "server"),
		"--lease", c.lease.String(), "--log-level", "debug", "--insecure-http")
	c.incarnations = append(c.incarnations, incarnation{start: time.Now()})
	c.url = "http://" + c.listen
	deadline := time.Now().Add(60 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get(c.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if !c.server.running() {
			c.t.Fatalf("the control plane exited at start:\n%s", tail(c.serverLog, 30))
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the control plane did not answer within 60s:\n%s", tail(c.serverLog, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killServer is kill -9 of the control plane. It first scrapes its applied
// counter (best effort), which the event accounting uses as a lower bound
// for this life.
func (c *cluster) killServer() {
	c.t.Helper()
	inc := &c.incarnations[len(c.incarnations)-1]
	if m, err := c.scrape(500 * time.Millisecond); err == nil {
		inc.applied, inc.scraped = m[`mercator_node_events_total{outcome="applied"}`], true
	}
	c.server.kill(c.t)
	inc.end = time.Now()
}

// scrape reads the control plane's Prometheus series.
func (c *cluster) scrape(timeout time.Duration) (map[string]float64, error) {
	hc := &http.Client{Timeout: timeout}
	req, err := http.NewRequest(http.MethodGet, c.url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token) // /metrics needs a reader's credential
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		line := s.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, s.Err()
}

// eventRows reads the control plane's durable event table: one row per
// (node, event ID) it applied, with the moment it first saw it.
func (c *cluster) eventRows() map[string]time.Time {
	c.t.Helper()
	path := filepath.Join(c.dir, "server", "mercator.db")
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		c.t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT node_id, event_id, seen_at FROM events`)
	if err != nil {
		c.t.Fatalf("read the control plane's event table: %v", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var nodeID, id, at string
		if err := rows.Scan(&nodeID, &id, &at); err != nil {
			c.t.Fatal(err)
		}
		ts, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			c.t.Fatalf("event %s seen_at %q: %v", id, at, err)
		}
		out[nodeID+"/"+id] = ts
	}
	if err := rows.Err(); err != nil {
		c.t.Fatal(err)
	}
	return out
}

// agent is one `mercator agent` process (restartable) for one node, with
// its own state directory, behind its own proxy.
type agent struct {
	c         *cluster
	node      string
	name      string
	state     string
	tokenFile string
	log       string
	proxy     *faultproxy.Proxy
	wire      *wire
	proc      *proc
	starts    int
	// fenced: a later enrollment superseded this agent; what it still
	// owes is refused by design (the new enrollment observes afresh).
	fenced bool
}

// addAgent invites a node and starts its agent through a new proxy, and
// waits until the control plane holds it ready with facts.
func (c *cluster) addAgent(suffix string) *agent {
	c.t.Helper()
	a := c.newAgent(c.id+"-"+suffix, suffix)
	a.start()
	c.waitFor("node "+a.node+" ready with facts", 60*time.Second, func() bool {
		n, err := c.client.GetNode(context.Background(), a.node)
		return err == nil && n.Status == api.NodeReady && n.Facts != nil
	})
	return a
}

// newAgent invites nodeID and prepares (but does not start) an agent for
// it; name tells its files apart when several agents serve one node.
func (c *cluster) newAgent(nodeID, name string) *agent {
	c.t.Helper()
	ctx, cancel := withTimeout(30 * time.Second)
	defer cancel()
	inv, err := c.client.InviteNode(ctx, nodeID, 0)
	if err != nil {
		c.t.Fatalf("invite %s: %v", nodeID, err)
	}
	a := &agent{c: c, node: nodeID, name: name, wire: newWire(),
		state: filepath.Join(c.dir, "agent-"+name), tokenFile: filepath.Join(c.dir, "invitation-"+name),
		log: filepath.Join(c.dir, "agent-"+name+".log")}
	if err := os.WriteFile(a.tokenFile, []byte(inv.Token+"\n"), 0o600); err != nil {
		c.t.Fatal(err)
	}
	if a.proxy, err = faultproxy.Start(c.listen, faultproxy.WithTap(a.wire)); err != nil {
		c.t.Fatal(err)
	}
	c.agents = append(c.agents, a)
	return a
}

// start starts the agent process (again, after a kill: it resumes the
// session in its state directory).
func (a *agent) start() {
	a.c.t.Helper()
	args := []string{"agent", "--control-plane", "http://" + a.proxy.Addr(), "--node-id", a.node,
		"--state", a.state, "--token-file", a.tokenFile, "--heartbeat", "1s", "--log-level", "debug"}
	if a.c.dockerHost != "" {
		args = append(args, "--docker-host", a.c.dockerHost)
	}
	a.starts++
	a.proc = startProc(a.c.t, "agent "+a.name, a.log, nil, args...)
}

// kill is kill -9 of the agent process.
func (a *agent) kill() { a.c.t.Helper(); a.proc.kill(a.c.t) }

// restart kills the agent, starts it again, and waits until it holds a new
// session stream.
func (a *agent) restart() {
	a.c.t.Helper()
	a.kill()
	since := time.Now()
	a.start()
	a.waitSession(since)
}

// waitSession waits until a session stream opened at or after since.
func (a *agent) waitSession(since time.Time) {
	a.c.t.Helper()
	a.c.waitFor("a session stream of "+a.name, 60*time.Second, func() bool {
		if !a.proc.running() {
			a.c.t.Fatalf("agent %s exited (%v):\n%s", a.name, a.proc.err, tail(a.log, 30))
		}
		return a.wire.sessionsSince(since) > 0
	})
}

// openState opens the state file of a stopped agent.
func (a *agent) openState() *nodeagent.State {
	a.c.t.Helper()
	if a.proc != nil && a.proc.running() {
		a.c.t.Fatalf("agent %s is running; its state file is locked", a.name)
	}
	st, err := nodeagent.OpenState(a.state)
	if err != nil {
		a.c.t.Fatalf("open the state of agent %s: %v", a.name, err)
	}
	return st
}

// waitFor polls cond every 50ms until it holds, failing the test after d:
// a hang guard, never a performance assertion.
func (c *cluster) waitFor(what string, d time.Duration, cond func() bool) {
	c.t.Helper()
	if !c.poll(d, cond) {
		c.t.Fatalf("gave up after %v waiting for %s", d, what)
	}
}

// poll is waitFor without the failure: it reports whether cond held within
// d, for a caller that counts the miss rather than fails on it.
func (c *cluster) poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// workloads are the commands the suite runs: short, so a trial takes
// seconds, and with known exits.
var workloads = [][]string{{"sleep", "1"}, {"exit", "3"}, {"echo", "hello"}, {"sleep", "2"}, {"lines", "5"}}

func (c *cluster) randomCommand() []string { return workloads[c.rng.IntN(len(workloads))] }

// submit creates a run of the workload image. Runs never get replaced
// (replace_after_seconds -1) unless the spec says otherwise, so that policy
// does not blur what a fault did.
func (c *cluster) submit(spec api.RunSpec) (api.Run, error) {
	if spec.Image == "" {
		spec.Image = c.workload
	}
	if spec.CPU == 0 {
		spec.CPU = 0.1
	}
	if spec.MemoryBytes == 0 {
		spec.MemoryBytes = 32 << 20
	}
	if spec.ReplaceAfterSeconds == 0 {
		spec.ReplaceAfterSeconds = -1
	}
	ctx, cancel := withTimeout(30 * time.Second)
	defer cancel()
	return c.client.SubmitRun(ctx, spec)
}

func (c *cluster) mustSubmit(spec api.RunSpec) api.Run {
	c.t.Helper()
	r, err := c.submit(spec)
	if err != nil {
		c.t.Fatalf("submit %v: %v", spec.Command, err)
	}
	return r
}

// allRuns lists every run, paging.
func (c *cluster) allRuns() ([]api.Run, error) {
	var out []api.Run
	before := ""
	for {
		ctx, cancel := withTimeout(30 * time.Second)
		page, err := c.client.ListRuns(ctx, client.ListRunsOptions{Limit: 100, Before: before})
		cancel()
		if err != nil {
			return nil, err
		}
		out = append(out, page.Runs...)
		if len(page.Runs) < 100 {
			return out, nil
		}
		before = page.Runs[len(page.Runs)-1].ID
	}
}

// waitAllTerminal waits until every run is terminal.
func (c *cluster) waitAllTerminal(d time.Duration) []api.Run {
	c.t.Helper()
	var runs []api.Run
	deadline := time.Now().Add(d)
	for {
		var err error
		runs, err = c.allRuns()
		if err == nil {
			var pending []string
			for _, r := range runs {
				if !api.Terminal(r.Status) {
					pending = append(pending, fmt.Sprintf("%s %s (%s)", r.ID, r.Status, r.Reason))
				}
			}
			if len(pending) == 0 {
				return runs
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("gave up after %v waiting for %d of %d runs to end: %s", d, len(pending), len(runs), strings.Join(pending, "; "))
			}
		} else if time.Now().After(deadline) {
			c.t.Fatalf("list runs: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// daemonContainer is what the daemon says about one Mercator container.
type daemonContainer struct {
	id, name, status, node string
	run                    string
	attempt                int
	exit                   int
	started, finished      time.Time
	stateErr               string
}

// containers lists and inspects every container of the given nodes.
func (c *cluster) containers(nodes []string) []daemonContainer {
	c.t.Helper()
	ctx, cancel := withTimeout(60 * time.Second)
	defer cancel()
	var out []daemonContainer
	for _, n := range nodes {
		list, err := c.docker.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", dockerengine.LabelNode+"="+n))})
		if err != nil {
			c.t.Fatalf("docker ps: %v", err)
		}
		for _, l := range list {
			info, err := c.docker.ContainerInspect(ctx, l.ID)
			if cerrdefs.IsNotFound(err) {
				// Gone between the list and the inspect: a create the
				// daemon rolled back because its client (an agent being
				// killed) went away mid-call.
				continue
			}
			if err != nil {
				c.t.Fatalf("docker inspect %s: %v", l.ID, err)
			}
			ct := daemonContainer{id: info.ID, name: strings.TrimPrefix(info.Name, "/"), node: n,
				run: info.Config.Labels[dockerengine.LabelRun]}
			ct.attempt, _ = strconv.Atoi(info.Config.Labels[dockerengine.LabelAttempt])
			if st := info.State; st != nil {
				ct.status, ct.exit, ct.stateErr = st.Status, st.ExitCode, st.Error
				ct.started, _ = time.Parse(time.RFC3339Nano, st.StartedAt)
				ct.finished, _ = time.Parse(time.RFC3339Nano, st.FinishedAt)
			}
			out = append(out, ct)
		}
	}
	return out
}

// containerOf inspects the container of one attempt, if the daemon has one.
func (c *cluster) containerOf(runID string, attempt int) (daemonContainer, bool) {
	for _, ct := range c.containers(c.nodes()) {
		if ct.run == runID && ct.attempt == attempt {
			return ct, true
		}
	}
	return daemonContainer{}, false
}

func (c *cluster) nodes() []string {
	seen := map[string]bool{}
	var out []string
	for _, a := range c.agents {
		if !seen[a.node] {
			seen[a.node] = true
			out = append(out, a.node)
		}
	}
	return out
}

func removeContainers(docker *dockerclient.Client, nodes []string) {
	ctx, cancel := withTimeout(60 * time.Second)
	defer cancel()
	for _, n := range nodes {
		list, err := docker.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", dockerengine.LabelNode+"="+n))})
		if err != nil {
			continue
		}
		for _, ct := range list {
			docker.ContainerRemove(ctx, ct.ID, container.RemoveOptions{Force: true})
		}
	}
}

// daemonEvents follows the daemon's container events for one node, so a
// test can act a few milliseconds after the daemon created or started a
// container.
type daemonEvents struct {
	mu     sync.Mutex
	cond   *sync.Cond
	seen   map[string]time.Time // "RUN/ATTEMPT/ACTION" → when
	cancel context.CancelFunc
}

func (c *cluster) followEvents(nodeID string) *daemonEvents {
	ctx, cancel := context.WithCancel(context.Background())
	d := &daemonEvents{seen: map[string]time.Time{}, cancel: cancel}
	d.cond = sync.NewCond(&d.mu)
	msgs, errs := c.docker.Events(ctx, events.ListOptions{Filters: filters.NewArgs(
		filters.Arg("type", "container"), filters.Arg("label", dockerengine.LabelNode+"="+nodeID))})
	go func() {
		for {
			select {
			case m := <-msgs:
				key := fmt.Sprintf("%s/%s/%s", m.Actor.Attributes[dockerengine.LabelRun], m.Actor.Attributes[dockerengine.LabelAttempt], m.Action)
				d.mu.Lock()
				if _, ok := d.seen[key]; !ok {
					d.seen[key] = time.Now()
				}
				d.mu.Unlock()
				d.cond.Broadcast()
			case <-errs:
				d.cond.Broadcast()
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	c.t.Cleanup(cancel)
	return d
}

// wait blocks until the daemon reported action ("create", "start") for the
// attempt, up to d; it reports whether it did.
func (d *daemonEvents) wait(runID string, attempt int, action string, dur time.Duration) bool {
	key := fmt.Sprintf("%s/%d/%s", runID, attempt, action)
	timer := time.AfterFunc(dur, d.cond.Broadcast)
	defer timer.Stop()
	deadline := time.Now().Add(dur)
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		if _, ok := d.seen[key]; ok {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		d.cond.Wait()
	}
}
