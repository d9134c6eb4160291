package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/pki"
)

// The tests of this file run the control plane over HTTPS with the CA it
// creates itself, as `mercator server` does by default, and check that
// agents and the CLI trust exactly that CA: an agent enrolls with its
// invitation alone, a man in the middle on loopback is refused and never
// sees a credential, plaintext to another machine is refused, and the
// server's certificate is renewed under connected agents.

// apiClient is a client of the cluster's API with token, verifying the
// server with the cluster's CA when it serves HTTPS.
func (c *cluster) apiClient(token string) *client.Client {
	c.t.Helper()
	cfg := client.Config{Addr: c.url, Token: token}
	if strings.HasPrefix(c.url, "https://") {
		cfg.CAFile = daemon.CAFile(c.dataDir)
	}
	cl, err := client.NewFromConfig(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// tlsConfig is what a hand-made HTTP client of the cluster needs to verify
// it: nil over plain HTTP.
func (c *cluster) tlsConfig() *tls.Config {
	if !strings.HasPrefix(c.url, "https://") {
		return nil
	}
	certs, err := pki.ReadCertsFile(daemon.CAFile(c.dataDir))
	if err != nil {
		c.t.Fatal(err)
	}
	return pki.ClientTLSConfig(certs)
}

// startTLSCluster is startCluster serving HTTPS, its certificate's life
// and renewal check shortened by validity and checkEvery when non-zero.
func startTLSCluster(t *testing.T, validity, checkEvery time.Duration) *cluster {
	c := startClusterWith(t, 10*time.Second, func(o *daemon.ServerOptions) {
		o.InsecureHTTP = false
		o.TLS.Validity, o.TLS.CheckEvery = validity, checkEvery
	})
	if !strings.HasPrefix(c.url, "https://") {
		t.Fatalf("the server serves %s, want https", c.url)
	}
	return c
}

// caFingerprint is the fingerprint of the CA the cluster wrote.
func (c *cluster) caFingerprint() string {
	c.t.Helper()
	certs, err := pki.ReadCertsFile(daemon.CAFile(c.dataDir))
	if err != nil {
		c.t.Fatal(err)
	}
	return pki.Fingerprint(certs[0])
}

// cliWith runs the command line with exactly env.
func (c *cluster) cliWith(env map[string]string, args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	code = cli.Main(c.ctx, args, strings.NewReader(""), &out, &errOut, func(k string) string { return env[k] })
	return out.String(), errOut.String(), code
}

// mitm is a server on loopback with a certificate of its own CA (valid for
// 127.0.0.1, so only the CA differs from the real server's): it records
// every handshake and every request it receives.
type mitm struct {
	url        string
	ca         *pki.Server
	handshakes atomic.Int64
	mu         sync.Mutex
	requests   []string // method, path, Authorization and body of each
}

func startMITM(t *testing.T) *mitm {
	t.Helper()
	ca, err := pki.OpenServer(pki.ServerOptions{DataDir: t.TempDir(), Hosts: []string{"127.0.0.1", "localhost"}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	m := &mitm{ca: ca}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := ca.TLSConfig()
	get := cfg.GetCertificate
	cfg.GetCertificate = func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { m.handshakes.Add(1); return get(h) }
	hs := &http.Server{ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m.mu.Lock()
		m.requests = append(m.requests, r.Method+" "+r.URL.Path+" auth="+r.Header.Get("Authorization")+" body="+string(body))
		m.mu.Unlock()
		http.Error(w, "a man in the middle", http.StatusTeapot)
	})}
	go hs.Serve(tls.NewListener(l, cfg))
	t.Cleanup(func() { hs.Close() })
	m.url = "https://" + l.Addr().String()
	return m
}

// assertNothingReceived fails unless the MITM was contacted (at least one
// handshake) and received no request at all, so no credential.
func (m *mitm) assertNothingReceived(t *testing.T, who string) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.handshakes.Load() == 0 {
		t.Fatalf("%s never contacted the man in the middle: the test proves nothing", who)
	}
	if len(m.requests) > 0 {
		t.Fatalf("%s sent the man in the middle %d requests: %q", who, len(m.requests), m.requests)
	}
}

// TestTLSAgentEnrollsWithTheInvitationAlone: `mercator agent` in a process
// of its own, given the HTTPS URL, a node ID, a state directory and the
// invitation file and nothing else, pins the CA the invitation names, keeps
// it, and runs work over TLS, an Artifact read from the control plane's
// signed URLs included; an agent restarted without an invitation trusts
// the CA it kept.
func TestTLSAgentEnrollsWithTheInvitationAlone(t *testing.T) {
	c := startTLSCluster(t, 0, 0)
	fp := c.caFingerprint()
	inv, err := c.client.InviteNode(c.ctx, uniqueNodeID(t, "probe"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(inv.Token, "mi1."+fp+".") || !strings.Contains(inv.Command, "--control-plane https://") {
		t.Fatalf("the invitation does not pin the CA %s over https: %q / %q", fp, inv.Token, inv.Command)
	}
	p := c.startProcessAgent("tls")
	kept, err := pki.ReadCertsFile(filepath.Join(c.dataDir, "process-agent-"+p.nodeID, "state", "control-plane-ca.pem"))
	if err != nil || pki.Fingerprint(kept[0]) != fp {
		t.Fatalf("the agent did not keep the pinned CA: %v", err)
	}
	// Work and an Artifact over TLS, through the CLI trusting the CA file.
	env := map[string]string{"MERCATOR_ADDR": c.url, "MERCATOR_TOKEN": c.token, "MERCATOR_CA_FILE": daemon.CAFile(c.dataDir)}
	file := filepath.Join(t.TempDir(), "greeting.txt")
	if err := os.WriteFile(file, []byte("over TLS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ref, errOut, code := c.cliWith(env, "artifact", "push", "greeting", file)
	if code != 0 {
		t.Fatalf("artifact push: %s", errOut)
	}
	id, errOut, code := c.cliWith(env, "run", "submit", "--image", c.workload, "--artifact", strings.TrimSpace(ref)+":/in.txt", "--", "cat", "/in.txt")
	if code != 0 {
		t.Fatalf("run submit: %s", errOut)
	}
	if done := c.wait(strings.TrimSpace(id)); done.Status != api.RunSucceeded || done.Attempts[len(done.Attempts)-1].NodeID != p.nodeID {
		t.Fatalf("the run over TLS: %s on %s (%s)", done.Status, done.Attempts[len(done.Attempts)-1].NodeID, done.Reason)
	}
	if logs, errOut, code := c.cliWith(env, "run", "logs", strings.TrimSpace(id)); code != 0 || !strings.Contains(logs, "over TLS") {
		t.Fatalf("run logs: %q %s", logs, errOut)
	}
	// In this process: enroll, stop, restart without an invitation.
	node := c.startAgent("tls-restart")
	c.stopAgent(node)
	c.restartAgent(node)
}

// TestTLSManInTheMiddleReceivesNoCredential: an agent holding an invitation
// that pins the real CA, an agent that kept the real CA, and the CLI with
// the real CA, each sent to a server with a certificate of another CA, all
// refuse it during the handshake, say what they expected and what came,
// and the server receives not one request.
func TestTLSManInTheMiddleReceivesNoCredential(t *testing.T) {
	c := startTLSCluster(t, 0, 0)
	m := startMITM(t)
	realFP, mitmFP := c.caFingerprint(), m.ca.Fingerprint()

	// A new agent with its invitation.
	nodeID := uniqueNodeID(t, "mitm")
	inv, err := c.client.InviteNode(c.ctx, nodeID, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	err = daemon.RunAgent(ctx, daemon.AgentOptions{ControlPlaneURL: m.url, NodeID: nodeID, StateDir: t.TempDir(),
		Invitation: inv.Token, Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), realFP) || !strings.Contains(err.Error(), mitmFP) || !strings.Contains(err.Error(), "no credential was sent") {
		t.Fatalf("want a refusal naming the expected %s and the presented %s, got %v", realFP, mitmFP, err)
	}
	m.assertNothingReceived(t, "an agent with an invitation")

	// An enrolled agent, restarted against the man in the middle: it keeps
	// trying (the real server may come back) and never sends its session.
	node := c.startAgent("mitm-kept")
	c.stopAgent(node)
	var agentLog bytes.Buffer
	var logMu sync.Mutex
	ctx2, cancel2 := context.WithTimeout(c.ctx, 4*time.Second)
	defer cancel2()
	err = daemon.RunAgent(ctx2, daemon.AgentOptions{ControlPlaneURL: m.url, NodeID: node, StateDir: filepath.Join(c.dataDir, "agent-"+node),
		Logger: slogTo(&lockedWriter{w: &agentLog, mu: &logMu})})
	if ctx2.Err() == nil {
		t.Fatalf("the agent stopped instead of retrying: %v", err)
	}
	m.assertNothingReceived(t, "an enrolled agent")
	logMu.Lock()
	if !strings.Contains(agentLog.String(), realFP) || !strings.Contains(agentLog.String(), mitmFP) {
		t.Errorf("the agent's log does not name both fingerprints:\n%s", agentLog.String())
	}
	logMu.Unlock()

	// The CLI, given the real CA.
	env := map[string]string{"MERCATOR_ADDR": m.url, "MERCATOR_TOKEN": c.token, "MERCATOR_CA_FILE": daemon.CAFile(c.dataDir)}
	_, errOut, code := c.cliWith(env, "node", "ls")
	if code == 0 || !strings.Contains(errOut, realFP) || !strings.Contains(errOut, mitmFP) {
		t.Fatalf("the CLI accepted the man in the middle or did not say why (exit %d): %s", code, errOut)
	}
	// `context add --ca-fingerprint` with the real fingerprint, at the man
	// in the middle's address.
	env = map[string]string{"MERCATOR_CONFIG": filepath.Join(t.TempDir(), "context.json")}
	tokenFile := filepath.Join(c.dataDir, "admin-token")
	if _, errOut, code := c.cliWith(env, "context", "add", "evil", "--addr", m.url, "--token-file", tokenFile, "--ca-fingerprint", realFP); code == 0 {
		t.Fatalf("context add pinned a CA the server does not have: %s", errOut)
	}
	m.assertNothingReceived(t, "the CLI")
}

// TestTLSPlaintextRefused: plain http:// to a machine other than this one
// is refused by the agent and the CLI before any connection, and the
// server serves plaintext only on loopback.
func TestTLSPlaintextRefused(t *testing.T) {
	const remote = "http://192.0.2.10:7070" // TEST-NET-1: never this machine
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := daemon.RunAgent(ctx, daemon.AgentOptions{ControlPlaneURL: remote, NodeID: "plain", StateDir: t.TempDir(), Invitation: "mci_x", Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), "refusing plain http://") {
		t.Fatalf("agent: want plaintext refused, got %v", err)
	}
	var out, errOut bytes.Buffer
	env := map[string]string{"MERCATOR_ADDR": remote, "MERCATOR_TOKEN": "secret"}
	if code := cli.Main(ctx, []string{"node", "ls"}, strings.NewReader(""), &out, &errOut, func(k string) string { return env[k] }); code == 0 ||
		!strings.Contains(errOut.String(), "refusing plain http://") {
		t.Fatalf("CLI: want plaintext refused, got exit %d: %s", code, errOut.String())
	}
	err = daemon.RunServer(ctx, daemon.ServerOptions{DataDir: t.TempDir(), Listen: "0.0.0.0:0", InsecureHTTP: true, Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), "loopback only") {
		t.Fatalf("server: want --insecure-http refused off loopback, got %v", err)
	}
}

// TestTLSCLIContexts: `context add --ca-fingerprint` fetches and pins the
// CA, client commands then verify the server with it; a CA file of another
// CA is refused; `context ls` and `context use` switch between contexts.
func TestTLSCLIContexts(t *testing.T) {
	c := startTLSCluster(t, 0, 0)
	dir := t.TempDir()
	env := map[string]string{"MERCATOR_CONFIG": filepath.Join(dir, "context.json")}
	tokenFile := filepath.Join(c.dataDir, "admin-token")
	run := func(args ...string) (string, string, int) { return c.cliWith(env, args...) }
	if _, errOut, code := run("context", "add", "prod", "--addr", c.url, "--token-file", tokenFile, "--ca-fingerprint", "sha256:"+strings.ToUpper(c.caFingerprint())); code != 0 {
		t.Fatalf("context add: %s", errOut)
	}
	if _, errOut, code := run("node", "ls"); code != 0 {
		t.Fatalf("node ls through the pinned context: %s", errOut)
	}
	// Another CA: an operator's mistake or an attacker's server.
	other := filepath.Join(dir, "other")
	if _, errOut, code := run("ca", "create", other); code != 0 {
		t.Fatalf("ca create: %s", errOut)
	}
	if _, errOut, code := run("context", "add", "wrong", "--addr", c.url, "--token-file", tokenFile, "--ca-file", filepath.Join(other, "ca.pem")); code != 0 {
		t.Fatalf("context add --ca-file: %s", errOut)
	}
	if _, errOut, code := run("node", "ls"); code == 0 || !strings.Contains(errOut, c.caFingerprint()) {
		t.Fatalf("the CLI accepted a server outside its context's CA (exit %d): %s", code, errOut)
	}
	out, _, _ := run("context", "ls")
	if !strings.Contains(out, "prod") || !strings.Contains(out, "* ") || !strings.Contains(out, "wrong") {
		t.Fatalf("context ls:\n%s", out)
	}
	if _, errOut, code := run("context", "use", "prod"); code != 0 {
		t.Fatalf("context use: %s", errOut)
	}
	if _, errOut, code := run("node", "ls"); code != 0 {
		t.Fatalf("node ls after context use prod: %s", errOut)
	}
	// A fingerprint the server's chain does not have.
	if _, errOut, code := run("context", "add", "bad", "--addr", c.url, "--token-file", tokenFile, "--ca-fingerprint", strings.Repeat("0", 64)); code == 0 {
		t.Fatalf("context add pinned a fingerprint the server does not present: %s", errOut)
	}
}

// TestTLSRenewalWhileAgentsStayConnected: with a server certificate living
// six seconds, the server renews it twice under a connected agent; the
// agent stays ready, its session and heartbeats carry on, and work placed
// after the first certificate expired runs. New connections get the new
// certificate.
func TestTLSRenewalWhileAgentsStayConnected(t *testing.T) {
	c := startTLSCluster(t, 6*time.Second, 100*time.Millisecond)
	node := c.startAgent("renew")
	cfg := c.tlsConfig()
	cfg.ClientSessionCache = nil
	serial := func() string {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(c.url, "https://"), cfg)
		if err != nil {
			t.Fatalf("a new connection after renewal: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	first := serial()
	seen := map[string]bool{first: true}
	deadline := time.Now().Add(60 * time.Second)
	for len(seen) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("saw %d certificates in 60s, want 3", len(seen))
		}
		n, err := c.client.GetNode(c.ctx, node)
		if err != nil || n.Status != "ready" {
			t.Fatalf("node %s during renewal: %v %v", node, n.Status, err)
		}
		seen[serial()] = true
		time.Sleep(200 * time.Millisecond)
	}
	run := c.submit(api.RunSpec{Command: []string{"echo", "renewed"}})
	if done := c.wait(run.ID); done.Status != api.RunSucceeded {
		t.Fatalf("a run after renewals: %s (%s)", done.Status, done.Reason)
	}
}

// lockedWriter serializes writes from the agent's goroutines.
type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
