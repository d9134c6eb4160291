package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/pgtest"
	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/nodeproto"
)

// startReplica runs one control-plane replica on dsn and returns its URL
// and admin credential.
func startReplica(t *testing.T, dsn string) (string, string) {
	// Plain HTTP on loopback: this test is about revocation; replicas over
	// TLS need a shared CA, which e2e/tls_test.go covers. Long idle
	// periods: only the replicas' signals, or the token cache's one-second
	// life, can make revocation quick.
	return startServer(t, ServerOptions{DB: dsn,
		Config: controlplane.Config{KeepAlive: 30 * time.Second, ReconcileEvery: 30 * time.Second}})
}

// startServer runs RunServer with o on a loopback port over plain HTTP,
// in a data directory of its own unless o names one, until the test ends,
// and returns its URL and admin credential.
func startServer(t *testing.T, o ServerOptions) (string, string) {
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	o.Listen, o.InsecureHTTP = "127.0.0.1:0", true
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	o.Ready = func(url, tokenFile string) { ready <- [2]string{url, tokenFile} }
	go func() { done <- RunServer(ctx, o) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case rd := <-ready:
		data, err := os.ReadFile(rd[1])
		if err != nil {
			t.Fatal(err)
		}
		return rd[0], strings.TrimSpace(string(data))
	case err := <-done:
		done <- err // for the cleanup's receive
		t.Fatalf("server did not start: %v", err)
	}
	return "", ""
}

// refusedWithin polls call until it fails with kind, and returns how long
// that took; the test fails past limit.
func refusedWithin(t *testing.T, what string, limit time.Duration, kind error, call func() error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := call()
		if errors.Is(err, kind) {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("%s: still %v after %v, want refused (%v) within %v", what, err, time.Since(start), kind, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRevocationReachesEveryReplica: two replicas share PostgreSQL; a
// token removed on A and a node removed on A are refused by B within one
// second.
func TestRevocationReachesEveryReplica(t *testing.T) {
	dsn := pgtest.FreshSchema(t)
	urlA, adminA := startReplica(t, dsn)
	urlB, adminB := startReplica(t, dsn)
	ctx := context.Background()
	a, b := client.New(urlA, adminA, nil), client.New(urlB, adminB, nil)
	// Each replica's data directory bootstrapped its own named admin.
	list, err := b.ListTokens(ctx)
	if err != nil || len(list.Tokens) != 2 || list.Tokens[0].Name != "admin" || list.Tokens[1].Name != "admin-2" {
		t.Fatalf("tokens of two bootstrapped replicas = %+v, %v", list, err)
	}

	// token rm on A; the token was in use (and cached) on B.
	tok, err := a.CreateToken(ctx, api.TokenRequest{Name: "ci", Role: "reader"})
	if err != nil {
		t.Fatal(err)
	}
	ci := client.New(urlB, tok.Secret, nil)
	if _, err := ci.ListNodes(ctx); err != nil {
		t.Fatalf("the token on replica B: %v", err)
	}
	if err := a.RemoveToken(ctx, "ci"); err != nil {
		t.Fatal(err)
	}
	took := refusedWithin(t, "token rm on A, called on B", time.Second, failure.ErrUnauthorized, func() error {
		_, err := ci.ListNodes(ctx)
		return err
	})
	t.Logf("token rm on replica A refused on replica B after %v", took)

	// node rm on A; the node's session is held by B.
	inv, err := a.InviteNode(ctx, "gpu-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	tr := nodeagent.NewHTTPTransport(urlB, nil)
	enr, err := tr.Enroll(ctx, nodeproto.EnrollmentRequest{NodeID: "gpu-1", Invitation: inv.Token, CapabilityVersion: nodeproto.Version})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.SendEvents(ctx, "gpu-1", enr.SessionToken, nil); err != nil {
		t.Fatalf("heartbeat on B: %v", err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	ended := make(chan error, 1)
	go func() { ended <- tr.Session(sctx, "gpu-1", enr.SessionToken, make(chan nodeproto.Command, 16)) }()
	time.Sleep(100 * time.Millisecond) // the stream is open on B
	start := time.Now()
	if _, err := a.RemoveNode(ctx, "gpu-1"); err != nil {
		t.Fatal(err)
	}
	took = refusedWithin(t, "node rm on A, heartbeat on B", time.Second, failure.ErrFenced, func() error {
		_, err := tr.SendEvents(ctx, "gpu-1", enr.SessionToken, nil)
		return err
	})
	t.Logf("node rm on replica A refused on replica B after %v", took)
	select {
	case <-ended:
		t.Logf("the session stream on B ended %v after node rm", time.Since(start))
	case <-time.After(time.Second):
		t.Errorf("the node's session stream on B outlived node rm by a second")
	}
}
