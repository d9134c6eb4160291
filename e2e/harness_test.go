// Package e2e holds Mercator's end-to-end tests: a real control plane, real
// agents and the real Docker daemon, with images built locally FROM scratch
// and pulled by digest from a registry on loopback. A missing Docker daemon
// fails these tests; it never skips them.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	dockerclient "github.com/docker/docker/client"

	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/internal/registrytest"
	"github.com/mercator/mercator/internal/testimage"
)

// cluster is one control plane and its agents, all in this process through
// their real Run entry points, talking HTTP over loopback.
type cluster struct {
	t        testing.TB
	ctx      context.Context
	url      string
	token    string
	dataDir  string
	client   *client.Client
	registry string
	workload string // pinned reference of testdata/images/workload
	stop     func()
	agents   map[string]context.CancelFunc
	stopped  map[string]chan struct{}
	lease    time.Duration
	wg       sync.WaitGroup
	// agentURL, when set, is where startArtifactAgent's agents reach the
	// control plane instead of url: a recording proxy (recordWire).
	agentURL string
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("MERCATOR_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

var (
	publishOnce sync.Map // registry host → pinned workload ref
)

// startCluster starts a registry, a control plane and no agents.
func startCluster(t testing.TB) *cluster { return startClusterWithLease(t, 10*time.Second) }

// startClusterWithLease is startCluster with the nodes' lease given. It
// serves plain HTTP on loopback, or HTTPS with its own CA when
// MERCATOR_E2E_TLS is set (for benchmarks over TLS; tests that send their
// own requests expect plain HTTP).
func startClusterWithLease(t testing.TB, lease time.Duration) *cluster {
	return startClusterWith(t, lease, nil)
}

// startClusterWith is startClusterWithLease with the server's options
// changed by configure (tls_test.go serves HTTPS through it).
func startClusterWith(t testing.TB, lease time.Duration, configure func(*daemon.ServerOptions)) *cluster {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &cluster{t: t, ctx: ctx, dataDir: t.TempDir(), agents: map[string]context.CancelFunc{}, stopped: map[string]chan struct{}{}, lease: lease}
	c.registry = registrytest.Start(t)
	pinned, err := testimage.Publish(ctx, filepath.Join(repoRoot(t), "testdata", "images", "workload"), c.registry)
	if err != nil {
		t.Fatalf("publish workload image: %v", err)
	}
	c.workload = pinned
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	opts := daemon.ServerOptions{
		DataDir: c.dataDir, Listen: "127.0.0.1:0", Logger: testLogger(t).With("c", "server"), InsecureHTTP: os.Getenv("MERCATOR_E2E_TLS") == "",
		Config: controlplane.Config{Lease: lease, KeepAlive: time.Second, ReconcileEvery: lease / 4},
		Ready:  func(url, tok string) { ready <- [2]string{url, tok} },
	}
	if configure != nil {
		configure(&opts)
	}
	go func() { done <- daemon.RunServer(ctx, opts) }()
	select {
	case r := <-ready:
		c.url = r[0]
		data, err := os.ReadFile(r[1])
		if err != nil {
			t.Fatal(err)
		}
		c.token = strings.TrimSpace(string(data))
	case err := <-done:
		t.Fatalf("control plane did not start: %v", err)
	}
	c.client = c.apiClient(c.token) // tls_test.go
	c.stop = func() {
		for _, stop := range c.agents {
			stop()
		}
		cancel()
		c.wg.Wait()
		<-done
	}
	t.Cleanup(func() {
		c.stop()
		removeContainers(t, c.nodeIDs())
	})
	return c
}

func (c *cluster) nodeIDs() []string {
	var ids []string
	for id := range c.agents {
		ids = append(ids, id)
	}
	return ids
}

// startAgent invites a node and runs an agent for it against the local
// daemon. It returns the node's ID (made unique per test).
func (c *cluster) startAgent(nodeID string) string {
	c.t.Helper()
	nodeID = uniqueNodeID(c.t, nodeID)
	inv, err := c.client.InviteNode(c.ctx, nodeID, 0)
	if err != nil {
		c.t.Fatalf("invite %s: %v", nodeID, err)
	}
	c.runAgent(nodeID, inv.Token)
	return nodeID
}

// stopAgent stops a node's agent process (its containers keep running, as
// they would if the agent crashed) and waits until it has exited.
func (c *cluster) stopAgent(nodeID string) {
	c.agents[nodeID]()
	<-c.stopped[nodeID]
}

// restartAgent starts a stopped node's agent again on the same state
// directory, without an invitation: it must resume its session.
func (c *cluster) restartAgent(nodeID string) { c.runAgent(nodeID, "") }

func (c *cluster) runAgent(nodeID, invitation string) {
	ctx, cancel := context.WithCancel(c.ctx)
	stopped := make(chan struct{})
	c.agents[nodeID], c.stopped[nodeID] = cancel, stopped
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(stopped)
		err := daemon.RunAgent(ctx, daemon.AgentOptions{
			ControlPlaneURL: c.url, NodeID: nodeID, StateDir: filepath.Join(c.dataDir, "agent-"+nodeID),
			Invitation: invitation, Heartbeat: min(time.Second, c.lease/4), Logger: testLogger(c.t).With("c", "agent", "node", nodeID),
		})
		if err != nil && ctx.Err() == nil {
			c.t.Errorf("agent %s stopped: %v", nodeID, err)
		}
	}()
	c.waitFor("node "+nodeID+" ready with facts", func() bool {
		n, err := c.client.GetNode(c.ctx, nodeID)
		return err == nil && n.Status == "ready" && n.Facts != nil
	})
}

// waitFor polls cond until it holds or a generous bound passes. The bound is
// a hang guard, not a performance assertion.
func (c *cluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// uniqueNodeID makes node IDs unique per test run, because every test shares
// the one Docker daemon and agents tell their containers apart by node label.
func uniqueNodeID(t testing.TB, base string) string {
	return base + "-" + strings.ToLower(strings.Trim(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()), "-"))[:min(20, len(t.Name()))] + "-" + time.Now().Format("150405.000000")[7:]
}

func repoRoot(t testing.TB) string {
	root, err := testimage.Root()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// removeContainers deletes the containers the given nodes' agents created.
func removeContainers(t testing.TB, nodes []string) {
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		return
	}
	defer cli.Close()
	ctx := context.Background()
	for _, n := range nodes {
		list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", "mercator.node="+n))})
		if err != nil {
			continue
		}
		for _, ctr := range list {
			cli.ContainerRemove(ctx, ctr.ID, container.RemoveOptions{Force: true})
		}
	}
}

// containersFor counts the daemon's containers of one run attempt.
func containersFor(t testing.TB, runID string) int {
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	list, err := cli.ContainerList(context.Background(), container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", "mercator.run="+runID))})
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

func decodeJSON(t testing.TB, resp *http.Response, v any) {
	t.Helper()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("decode %s response: %v", resp.Request.URL.Path, err)
	}
}

// publish builds one of the repo's images (examples/NAME or
// testdata/images/NAME) and pushes it to the cluster's registry.
func (c *cluster) publish(name string) string {
	c.t.Helper()
	dir := filepath.Join(repoRoot(c.t), "examples", name)
	if _, err := os.Stat(dir); err != nil {
		dir = filepath.Join(repoRoot(c.t), "testdata", "images", name)
	}
	pinned, err := testimage.Publish(c.ctx, dir, c.registry)
	if err != nil {
		c.t.Fatalf("publish %s: %v", name, err)
	}
	return pinned
}

// metricSeries is the value of one series (its name and labels exactly as
// the exposition writes them) on the /metrics of the control plane at
// url, read with token; "" when the series is absent.
func metricSeries(t testing.TB, url, token, series string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token) // /metrics needs a reader's credential
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return v
		}
	}
	return ""
}
