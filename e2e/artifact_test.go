package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/internal/logbuffer"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/artifactcache"
	"github.com/mercator/mercator/cli"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/faultproxy"
	"github.com/mercator/mercator/internal/registrytest"
	"github.com/mercator/mercator/internal/testimage"
	"github.com/mercator/mercator/nodeagent/dockerruntime"
	"github.com/mercator/mercator/nodeproto"
)

// artifactCluster is a cluster whose control plane can be configured:
// its minted reads may point at a proxy (publicURL), and its options
// changed (mutate).
type artifactClusterOptions struct {
	publicURL func() string
	mutate    func(*daemon.ServerOptions)
}

// startArtifactCluster is startCluster with control-plane options the
// Artifact tests need. The server's URL is known only once it listens, so
// a proxy in front of it is told the address through target (set before
// anything can reach the server).
func startArtifactCluster(t testing.TB, target *atomic.Value, o artifactClusterOptions) *cluster {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lease := 10 * time.Second
	c := &cluster{t: t, ctx: ctx, dataDir: t.TempDir(), agents: map[string]context.CancelFunc{}, stopped: map[string]chan struct{}{}, lease: lease}
	c.registry = registrytest.Start(t)
	pinned, err := testimage.Publish(ctx, filepath.Join(repoRoot(t), "testdata", "images", "workload"), c.registry)
	if err != nil {
		t.Fatalf("publish workload image: %v", err)
	}
	c.workload = pinned
	opts := daemon.ServerOptions{
		DataDir: c.dataDir, Listen: "127.0.0.1:0", Logger: testLogger(t).With("c", "server"), InsecureHTTP: true,
		Config: controlplane.Config{Lease: lease, KeepAlive: time.Second, ReconcileEvery: lease / 4},
	}
	if o.publicURL != nil {
		opts.PublicURL = o.publicURL()
	}
	if o.mutate != nil {
		o.mutate(&opts)
	}
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	opts.Ready = func(url, tok string) {
		if target != nil {
			target.Store(url)
		}
		ready <- [2]string{url, tok}
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
	c.client = client.New(c.url, c.token, nil)
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

// startArtifactAgent invites a node and runs its agent with the given
// Artifact budget; the root is STATE/artifacts.
func (c *cluster) startArtifactAgent(nodeID string, budget int64, logs io.Writer) string {
	c.t.Helper()
	nodeID = uniqueNodeID(c.t, nodeID)
	inv, err := c.client.InviteNode(c.ctx, nodeID, 0)
	if err != nil {
		c.t.Fatalf("invite %s: %v", nodeID, err)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	stopped := make(chan struct{})
	c.agents[nodeID], c.stopped[nodeID] = cancel, stopped
	logger := testLogger(c.t).With("c", "agent", "node", nodeID)
	if logs != nil {
		logger = slogTo(logs)
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(stopped)
		url := c.url
		if c.agentURL != "" {
			url = c.agentURL
		}
		err := daemon.RunAgent(ctx, daemon.AgentOptions{
			ControlPlaneURL: url, NodeID: nodeID, StateDir: c.agentState(nodeID), ArtifactBudget: budget,
			Invitation: inv.Token, Heartbeat: 250 * time.Millisecond, Logger: logger,
		})
		if err != nil && ctx.Err() == nil {
			c.t.Errorf("agent %s stopped: %v", nodeID, err)
		}
	}()
	c.waitFor("node "+nodeID+" ready with facts", func() bool {
		n, err := c.client.GetNode(c.ctx, nodeID)
		return err == nil && n.Status == "ready" && n.Facts != nil
	})
	return nodeID
}

func (c *cluster) agentState(nodeID string) string { return filepath.Join(c.dataDir, "agent-"+nodeID) }

// mercator runs the command line against the cluster and returns stdout,
// failing the test on a non-zero exit.
func (c *cluster) mercator(args ...string) string {
	c.t.Helper()
	out, errOut, code := c.mercatorExit("", args...)
	if code != 0 {
		c.t.Fatalf("mercator %s: exit %d\n%s", strings.Join(args, " "), code, errOut)
	}
	return out
}

func (c *cluster) mercatorExit(stdin string, args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	env := map[string]string{"MERCATOR_ADDR": c.url, "MERCATOR_TOKEN": c.token, "MERCATOR_CONFIG": filepath.Join(c.dataDir, "cli", "context.json")}
	code = cli.Main(c.ctx, args, strings.NewReader(stdin), &out, &errOut, func(k string) string { return env[k] })
	return out.String(), errOut.String(), code
}

func randomFile(t testing.TB, dir, name string, size int) (string, []byte) {
	t.Helper()
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, data
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestArtifactPushMountRead: a file and a directory pushed through the
// CLI, mounted read-only into containers and read there; the same content
// pushed again is the same version; the node's facts list what it holds
// and the link reading its copy made.
func TestArtifactPushMountRead(t *testing.T) {
	c := startArtifactCluster(t, nil, artifactClusterOptions{})
	nodeID := c.startArtifactAgent("n", 0, nil)
	dir := t.TempDir()
	blobPath, blob := randomFile(t, dir, "blob.bin", 12<<20) // above the link-sample minimum
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(tree, "sub", "a.txt"), []byte("hello from a tree\n"), 0o644)
	os.WriteFile(filepath.Join(tree, "b.txt"), []byte("b\n"), 0o600)

	ref := strings.TrimSpace(c.mercator("artifact", "push", "data", blobPath))
	if ref != "data@v1" {
		t.Fatalf("push printed %q, want data@v1 alone", ref)
	}
	if again := strings.TrimSpace(c.mercator("artifact", "push", "data", blobPath)); again != "data@v1" {
		t.Fatalf("pushing the same content again printed %q, want the existing data@v1", again)
	}
	treeRef := strings.TrimSpace(c.mercator("artifact", "push", "tree", tree))
	if treeRef != "tree@v1" {
		t.Fatalf("directory push printed %q", treeRef)
	}
	if again := strings.TrimSpace(c.mercator("artifact", "push", "tree", tree)); again != "tree@v1" {
		t.Fatalf("pushing the same tree again printed %q: the archive is not deterministic", again)
	}
	v, err := c.client.GetArtifact(c.ctx, "data", "v1")
	if err != nil || v.SHA256 != sha256Hex(blob) || v.Size != int64(len(blob)) || v.Format != api.ArtifactFile {
		t.Fatalf("data@v1 = %+v, %v", v, err)
	}
	if ls := c.mercator("artifact", "ls"); !strings.Contains(ls, "data@v1") || !strings.Contains(ls, "tree@v1") {
		t.Errorf("artifact ls:\n%s", ls)
	}

	run := c.submit(api.RunSpec{Command: []string{"sha256", "/data/blob.bin"},
		Artifacts: []api.ArtifactMount{{Name: "data", Version: "v1", MountPath: "/data/blob.bin", MinReadBytesPerSecond: 1 << 20}}})
	if run.Artifacts[0].SHA256 != v.SHA256 {
		t.Errorf("the submitted run does not name the content: %+v", run.Artifacts)
	}
	done := c.wait(run.ID)
	want := fmt.Sprintf("%s %d", v.SHA256, len(blob))
	if done.Status != api.RunSucceeded || !strings.Contains(c.logsHaving(run.ID, want), want) {
		t.Fatalf("run = %s (%s), logs %q; want %q", done.Status, done.Reason, c.logs(run.ID), want)
	}

	// The directory, through the CLI's --artifact flag (newest version),
	// and the mount is read-only.
	id := strings.TrimSpace(c.mercator("run", "submit", "--image", c.workload, "--artifact", "tree:/in", "--", "cat", "/in/sub/a.txt"))
	if done := c.wait(id); done.Status != api.RunSucceeded || c.logsHaving(id, "hello from a tree\n") != "hello from a tree\n" {
		t.Fatalf("tree run = %s (%s), logs %q", done.Status, done.Reason, c.logs(id))
	}
	ro := c.submit(api.RunSpec{Command: []string{"touch", "/in/new"}, Artifacts: []api.ArtifactMount{{Name: "tree", MountPath: "/in"}}})
	if done := c.wait(ro.ID); done.Status != api.RunSucceeded || !strings.Contains(c.logsHaving(ro.ID, "read-only file system"), "read-only file system") {
		t.Fatalf("writing into the mount: %s, logs %q; want a read-only file system error", done.Status, c.logs(ro.ID))
	}

	// The node's facts: both versions held, and the 12 MiB copy as its
	// link reading.
	var facts nodeproto.NodeFacts
	c.waitFor("facts listing both artifacts", func() bool {
		facts = nodeFacts(t, c, nodeID)
		return len(facts.Artifacts) == 2 && facts.Link != nil
	})
	if facts.Link.Source != artifactcache.CopySource || facts.Link.Confidence != artifactcache.MeasuredLinkConfidence ||
		facts.Link.Bytes != int64(len(blob)) || facts.Link.ValidUntil.Sub(facts.Link.MeasuredAt) != artifactcache.MeasuredLinkValidity {
		t.Errorf("link reading = %+v", facts.Link)
	}
	t.Logf("link reading published: %s over %d bytes", rate(facts.Link.BytesPerSecond), facts.Link.Bytes)

	// Validation at submit: a missing version, a bad mount path.
	for what, spec := range map[string]api.RunSpec{
		"missing version": {Command: []string{"echo"}, Artifacts: []api.ArtifactMount{{Name: "data", Version: "v9", MountPath: "/d"}}},
		"relative path":   {Command: []string{"echo"}, Artifacts: []api.ArtifactMount{{Name: "data", MountPath: "d"}}},
		"root":            {Command: []string{"echo"}, Artifacts: []api.ArtifactMount{{Name: "data", MountPath: "/"}}},
		"dot-dot":         {Command: []string{"echo"}, Artifacts: []api.ArtifactMount{{Name: "data", MountPath: "/a/../b"}}},
		"twice":           {Command: []string{"echo"}, Artifacts: []api.ArtifactMount{{Name: "data", MountPath: "/d"}, {Name: "tree", MountPath: "/d"}}},
	} {
		spec.Image = c.workload
		if _, err := c.client.SubmitRun(c.ctx, spec); !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("%s: submit = %v, want invalid", what, err)
		}
	}
}

// cutAfter closes the connection carrying the client's byte past limit
// (counted over every connection) and calls cut first: an upload broken
// midway and the command pushing it interrupted.
type cutAfter struct {
	limit int64
	sent  atomic.Int64
	cut   func()
}

func (c *cutAfter) Data(_ uint64, dir faultproxy.Direction, p []byte) faultproxy.Verdict {
	if dir == faultproxy.ClientToServer && c.sent.Add(int64(len(p))) > c.limit {
		c.cut()
		return faultproxy.Close
	}
	return faultproxy.Forward
}

func (c *cutAfter) Closed(uint64) {}

// TestArtifactPushResumesAcrossRuns: a push whose connection breaks and
// whose command is interrupted midway is resumed by the next run of the
// same command, from where the control plane stands rather than from the
// start (the client rereads what was sent to rebuild its CRC-32C), and the
// version has exactly the file's content.
func TestArtifactPushResumesAcrossRuns(t *testing.T) {
	c := startArtifactCluster(t, nil, artifactClusterOptions{})
	blobPath, blob := randomFile(t, t.TempDir(), "blob.bin", 24<<20)
	u, err := url.Parse(c.url)
	if err != nil {
		t.Fatal(err)
	}
	ctx, interrupt := context.WithCancel(c.ctx)
	defer interrupt()
	proxy, err := faultproxy.Start(u.Host, faultproxy.WithTap(&cutAfter{limit: 8 << 20, cut: interrupt}))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	config := filepath.Join(c.dataDir, "cli", "context.json")
	env := map[string]string{"MERCATOR_ADDR": "http://" + proxy.Addr(), "MERCATOR_TOKEN": c.token, "MERCATOR_CONFIG": config}
	var out, errOut bytes.Buffer
	if code := cli.Main(ctx, []string{"artifact", "push", "data", blobPath}, strings.NewReader(""), &out, &errOut, func(k string) string { return env[k] }); code == 0 {
		t.Fatalf("the interrupted push exited 0, printing %q", out.String())
	}
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(config), "uploads.json"))
	var memory map[string]string
	if err != nil || json.Unmarshal(raw, &memory) != nil || len(memory) != 1 {
		t.Fatalf("upload memory after the interrupted push: %s %v", raw, err)
	}
	var id string
	for _, v := range memory {
		id = v
	}
	var up api.Upload
	c.waitFor("the broken send to land", func() bool {
		up, err = c.client.GetUpload(c.ctx, id)
		return err == nil && up.Received > 0
	})
	if up.Received >= int64(len(blob)) {
		t.Fatalf("the broken send delivered everything (%d bytes); nothing left to resume", up.Received)
	}
	t.Logf("interrupted at %d of %d bytes", up.Received, len(blob))

	if ref := strings.TrimSpace(c.mercator("artifact", "push", "data", blobPath)); ref != "data@v1" {
		t.Fatalf("the resumed push printed %q, want data@v1 alone", ref)
	}
	v, err := c.client.GetArtifact(c.ctx, "data", "v1")
	if err != nil || v.SHA256 != sha256Hex(blob) || v.Size != int64(len(blob)) {
		t.Fatalf("data@v1 = %+v, %v", v, err)
	}
	// The upload the first run began is the one committed: none is left.
	if _, err := c.client.GetUpload(c.ctx, id); !errors.Is(err, failure.ErrNotFound) {
		t.Errorf("upload %s after the resumed push: %v, want committed and gone", id, err)
	}
	if left, _ := os.ReadDir(filepath.Join(c.dataDir, "uploads")); len(left) != 0 {
		t.Errorf("uploads left behind: %v; the second run started over instead of resuming", left)
	}
	if raw, _ := os.ReadFile(filepath.Join(filepath.Dir(config), "uploads.json")); strings.Contains(string(raw), id) {
		t.Errorf("the upload memory still holds %s after the push: %s", id, raw)
	}
}

// logsHaving returns a finished run's logs once they contain want, or what
// they hold after a while. A node reports an exit after the output it read,
// but only waits so long for the output's delivery, and a loaded machine
// can take longer.
func (c *cluster) logsHaving(id, want string) string {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := c.logs(id)
		if strings.Contains(got, want) || time.Now().After(deadline) {
			return got
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func nodeFacts(t testing.TB, c *cluster, nodeID string) nodeproto.NodeFacts {
	t.Helper()
	resp, err := http.NewRequestWithContext(c.ctx, http.MethodGet, c.url+"/v1/nodes/"+nodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Header.Set("Authorization", "Bearer "+c.token)
	r, err := http.DefaultClient.Do(resp)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var n struct {
		Facts nodeproto.NodeFacts `json:"facts"`
	}
	decodeJSON(t, r, &n)
	return n.Facts
}

func rate(bps int64) string { return fmt.Sprintf("%.1f MB/s", float64(bps)/1e6) }

// corruptingProxy forwards to the control plane and flips a byte in the
// body of the first n content reads it forwards.
type corruptingProxy struct {
	*httputilProxy
	corrupt atomic.Int32
	reads   atomic.Int32
	mu      sync.Mutex
	urls    []string
}

type httputilProxy = httputil.ReverseProxy

func newCorruptingProxy(t testing.TB, target *atomic.Value, corrupt int) (*corruptingProxy, string) {
	p := &corruptingProxy{}
	p.corrupt.Store(int32(corrupt))
	p.httputilProxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			u, _ := url.Parse(target.Load().(string))
			r.SetURL(u)
		},
		ModifyResponse: func(resp *http.Response) error {
			if !strings.HasPrefix(resp.Request.URL.Path, content.ReadPath) {
				return nil
			}
			p.reads.Add(1)
			p.mu.Lock()
			p.urls = append(p.urls, resp.Request.URL.String())
			p.mu.Unlock()
			if resp.StatusCode == http.StatusOK && p.corrupt.Add(-1) >= 0 {
				resp.Body = &flipReader{r: resp.Body, at: 1000}
			}
			return nil
		},
	}
	l, err := listenLoopback()
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: p}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return p, "http://" + l.Addr().String()
}

type flipReader struct {
	r   io.ReadCloser
	pos int64
	at  int64
}

func (f *flipReader) Read(b []byte) (int, error) {
	n, err := f.r.Read(b)
	if f.at >= f.pos && f.at < f.pos+int64(n) {
		b[f.at-f.pos] ^= 0xff
	}
	f.pos += int64(n)
	return n, err
}
func (f *flipReader) Close() error { return f.r.Close() }

// TestArtifactCorruptTransferRetried: the content reaching the node is
// damaged on the way (a proxy flips one byte of the first read); the node
// refuses it, fetches again and runs with the exact content.
func TestArtifactCorruptTransferRetried(t *testing.T) {
	var target atomic.Value
	var proxy *corruptingProxy
	var proxyURL string
	c := startArtifactCluster(t, &target, artifactClusterOptions{publicURL: func() string {
		proxy, proxyURL = newCorruptingProxy(t, &target, 1)
		return proxyURL
	}})
	var agentLog logbuffer.Buffer
	nodeID := c.startArtifactAgent("n", 0, &agentLog)
	data := bytes.Repeat([]byte("exact bytes\n"), 100_000)
	v := pushBytes(t, c, "data", data)
	run := c.submit(api.RunSpec{Command: []string{"sha256", "/d"}, Artifacts: []api.ArtifactMount{{Name: "data", MountPath: "/d"}}})
	done := c.wait(run.ID)
	if done.Status != api.RunSucceeded || !strings.Contains(c.logsHaving(run.ID, v.SHA256), v.SHA256) {
		t.Fatalf("run = %s (%s) logs %q", done.Status, done.Reason, c.logs(run.ID))
	}
	if proxy.reads.Load() < 2 {
		t.Errorf("%d content reads, want the corrupt one and at least one more", proxy.reads.Load())
	}
	if !strings.Contains(agentLog.String(), "is not the version") {
		t.Errorf("the agent did not report refusing the corrupt copy; its log:\n%s", agentLog.String())
	}
	// The minted read is for this object alone: the same signature does not
	// read another.
	proxy.mu.Lock()
	minted := proxy.urls[0]
	proxy.mu.Unlock()
	other := pushBytes(t, c, "other", []byte("other content"))
	forged := strings.Replace(minted, v.SHA256, other.SHA256, 1)
	forged = strings.Replace(forged, proxyURL, c.url, 1)
	if code, body := get(t, forged); code != http.StatusUnauthorized {
		t.Errorf("a read minted for %s used for %s: %d %s", v.SHA256, other.SHA256, code, body)
	}
	_ = nodeID
}

func pushBytes(t testing.TB, c *cluster, name string, data []byte) api.ArtifactVersion {
	t.Helper()
	v, err := c.client.PushArtifact(c.ctx, name, client.BytesPayload(data, sha256Hex(data), api.ArtifactFile), client.PushOptions{})
	if err != nil {
		t.Fatalf("push %s: %v", name, err)
	}
	return v
}

func get(t testing.TB, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// TestArtifactReadsRefused: the node's runtime refuses a command without a
// minted read, and one whose read expired, in Mercator's words; the
// control plane refuses an expired read that reaches it anyway.
func TestArtifactReadsRefused(t *testing.T) {
	c := startArtifactCluster(t, nil, artifactClusterOptions{})
	data := []byte("content behind a minted read")
	v := pushBytes(t, c, "data", data)
	rt, err := dockerruntime.New("", dockerruntime.WithArtifactRoot(filepath.Join(t.TempDir(), "artifacts")))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	cmd := nodeproto.PrepareArtifactCommand{Name: "data", Version: v.Version, SHA256: v.SHA256, Size: v.Size, Format: v.Format}

	err = rt.PrepareArtifact(c.ctx, cmd)
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "no minted read") {
		t.Errorf("a command without a minted read: %v", err)
	}

	// Mint as the server would, with its own key, an hour ago.
	signer, err := content.OpenLocal(filepath.Join(c.dataDir, "content"), filepath.Join(c.dataDir, "content-key"), c.url,
		func() time.Time { return time.Now().Add(-time.Hour) })
	if err != nil {
		t.Fatal(err)
	}
	expired, expiredAt, err := signer.ReadURL(c.ctx, v.SHA256, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stated := cmd
	stated.URL, stated.ExpiresAt = expired, expiredAt
	err = rt.PrepareArtifact(c.ctx, stated)
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("a command whose read expired: %v", err)
	}
	// A node whose clock disagrees still meets the server's refusal.
	lying := cmd
	lying.URL, lying.ExpiresAt = expired, time.Now().Add(time.Hour)
	err = rt.PrepareArtifact(c.ctx, lying)
	if !errors.Is(err, failure.ErrUnauthorized) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("an expired read presented to the control plane: %v", err)
	}
	if code, body := get(t, expired); code != http.StatusUnauthorized || !strings.Contains(body, "expired") {
		t.Errorf("GET of an expired read: %d %s", code, body)
	}
	// A fresh read works, through the same runtime.
	fresh, _ := content.OpenLocal(filepath.Join(c.dataDir, "content"), filepath.Join(c.dataDir, "content-key"), c.url, nil)
	good := cmd
	good.URL, good.ExpiresAt, _ = fresh.ReadURL(c.ctx, v.SHA256, time.Minute)
	if err := rt.PrepareArtifact(c.ctx, good); err != nil {
		t.Errorf("a fresh minted read: %v", err)
	}
}

// TestArtifactBudgetAndEviction: a version larger than the node's budget
// fails its run with an error saying so and leaves nothing on disk; copies
// no running work uses are evicted, least recently used first, and a copy a
// running container mounts is not.
func TestArtifactBudgetAndEviction(t *testing.T) {
	c := startArtifactCluster(t, nil, artifactClusterOptions{})
	const size = 1 << 20
	nodeID := c.startArtifactAgent("n", 5*size/2, nil) // room for two
	mk := func(name string) api.ArtifactVersion {
		return pushBytes(t, c, name, bytes.Repeat([]byte(name[:1]), size))
	}
	a, b, d := mk("a"), mk("b"), mk("d")
	big := pushBytes(t, c, "big", bytes.Repeat([]byte("B"), 3*size))

	run := c.submit(api.RunSpec{Command: []string{"echo"}, Artifacts: []api.ArtifactMount{{Name: "big", MountPath: "/big"}}})
	done := c.wait(run.ID)
	if done.Status != api.RunFailed || !strings.Contains(done.Reason+attemptErrors(done), "do not fit") {
		t.Fatalf("run over budget = %s, reason %q, attempts %q", done.Status, done.Reason, attemptErrors(done))
	}
	root := filepath.Join(c.agentState(nodeID), "artifacts")
	if _, err := os.Stat(filepath.Join(root, "sha256", big.SHA256)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a copy of the version over budget exists (%v)", err)
	}

	// a: held by a running container; b: used and done; then d needs room.
	long := c.submit(api.RunSpec{Command: []string{"sleep", "60"}, Artifacts: []api.ArtifactMount{{Name: "a", MountPath: "/a"}}})
	c.waitFor("the sleeper running", func() bool {
		r, err := c.client.GetRun(c.ctx, long.ID)
		return err == nil && r.Status == api.RunRunning
	})
	short := c.submit(api.RunSpec{Command: []string{"cat", "/b"}, Artifacts: []api.ArtifactMount{{Name: "b", MountPath: "/b"}}})
	if done := c.wait(short.ID); done.Status != api.RunSucceeded {
		t.Fatalf("b run = %s %s", done.Status, done.Reason)
	}
	third := c.submit(api.RunSpec{Command: []string{"sha256", "/d"}, Artifacts: []api.ArtifactMount{{Name: "d", MountPath: "/d"}}})
	if done := c.wait(third.ID); done.Status != api.RunSucceeded {
		t.Fatalf("d run = %s %s %s", done.Status, done.Reason, attemptErrors(done))
	}
	held := func() map[string]bool {
		out := map[string]bool{}
		for _, h := range nodeFacts(t, c, nodeID).Artifacts {
			out[h.SHA256] = true
		}
		return out
	}
	c.waitFor("facts after the eviction", func() bool { h := held(); return h[d.SHA256] && !h[b.SHA256] })
	if h := held(); !h[a.SHA256] {
		t.Errorf("the copy a running container mounts was evicted: held %v", h)
	}
	if _, err := os.Stat(filepath.Join(root, "sha256", b.SHA256)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("b's copy is still on disk (%v)", err)
	}
	if _, err := c.client.CancelRun(c.ctx, long.ID); err != nil {
		t.Fatal(err)
	}
}

func attemptErrors(r api.Run) string {
	var s []string
	for _, a := range r.Attempts {
		s = append(s, a.Error)
	}
	return strings.Join(s, "; ")
}

// TestArtifactFullDisk: the artifact root is a small tmpfs that something
// else fills while a copy is under way. The copy fails with an error that
// says the disk is full, and no partial copy is left or published.
func TestArtifactFullDisk(t *testing.T) {
	root := filepath.Join(t.TempDir(), "small")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", root).CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("cannot mount a tmpfs to fill (needs root; CI runs as root): %v %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs to fill (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", root).Run() })

	data := make([]byte, 6<<20)
	rand.Read(data)
	digest := sha256Hex(data)
	filled := make(chan struct{})
	// The node checks the free space before it asks for the content, so
	// the disk is filled once the request has arrived: after the check,
	// during the copy.
	requested := make(chan struct{})
	var once sync.Once
	srv := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(data)))
		w.Write(data[:1<<20])
		w.(http.Flusher).Flush()
		once.Do(func() { close(requested) })
		<-filled // something else takes the disk meanwhile
		w.Write(data[1<<20:])
	}))
	rt, err := dockerruntime.New("", dockerruntime.WithArtifactRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	go func() {
		defer close(filled)
		<-requested
		f, err := os.Create(filepath.Join(root, "filler"))
		if err != nil {
			return
		}
		io.Copy(f, io.LimitReader(zeroReader{}, 8<<20)) // until the disk is full
		f.Close()
	}()
	err = rt.PrepareArtifact(context.Background(), nodeproto.PrepareArtifactCommand{Name: "data", Version: "v1", SHA256: digest,
		Size: int64(len(data)), URL: srv + "/x", ExpiresAt: time.Now().Add(time.Minute)})
	if !errors.Is(err, failure.ErrConflict) || !strings.Contains(err.Error(), "disk holding the artifact root is full") {
		t.Fatalf("copy onto a full disk: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(root, "sha256")); len(entries) != 0 {
		t.Errorf("%d copies published on a full disk", len(entries))
	}
	if entries, _ := os.ReadDir(filepath.Join(root, "tmp")); len(entries) != 0 {
		t.Errorf("%d partial copies left in tmp", len(entries))
	}
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) { clear(b); return len(b), nil }

func listenLoopback() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func httptestServer(t testing.TB, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
