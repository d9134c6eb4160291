package e2e

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/daemon"
)

// postgresDSN returns a DSN for a fresh schema on the test PostgreSQL
// server (MERCATOR_TEST_POSTGRES, which scripts/test.sh sets from
// scripts/ensure-postgres.sh). In CI a missing server fails the test.
func postgresDSN(t *testing.T) string {
	base := os.Getenv("MERCATOR_TEST_POSTGRES")
	if base == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MERCATOR_TEST_POSTGRES is not set; scripts/test.sh sets it from scripts/ensure-postgres.sh")
		}
		t.Skip("MERCATOR_TEST_POSTGRES is not set; run `export MERCATOR_TEST_POSTGRES=$(bash scripts/ensure-postgres.sh)`")
	}
	db, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	schema := fmt.Sprintf("e2e_%d", time.Now().UnixNano())
	if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("pgx", base)
		if err == nil {
			db.Exec("DROP SCHEMA " + schema + " CASCADE")
			db.Close()
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

type replicaProc struct {
	url, token string
	client     *client.Client
	stop       context.CancelFunc
	done       chan error
}

func startReplica(t *testing.T, dsn string) *replicaProc {
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]string, 1)
	r := &replicaProc{stop: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- daemon.RunServer(ctx, daemon.ServerOptions{
			DB: dsn, DataDir: t.TempDir(), Listen: "127.0.0.1:0", Logger: testLogger(t).With("c", "replica"), InsecureHTTP: true,
			Config: controlplane.Config{Lease: 5 * time.Second, KeepAlive: 30 * time.Second, ReconcileEvery: 30 * time.Second},
			Ready:  func(url, tok string) { ready <- [2]string{url, tok} },
		})
	}()
	select {
	case rd := <-ready:
		data, err := os.ReadFile(rd[1])
		if err != nil {
			t.Fatal(err)
		}
		r.url, r.token = rd[0], strings.TrimSpace(string(data))
	case err := <-r.done:
		t.Fatalf("replica did not start: %v", err)
	}
	r.client = client.New(r.url, r.token, nil)
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// leaderGauge reads mercator_scheduler_leader from a replica's metrics.
func leaderGauge(t *testing.T, r *replicaProc) string {
	req, err := http.NewRequest(http.MethodGet, r.url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+r.token) // /metrics needs a reader's credential
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "mercator_scheduler_leader "); ok {
			return v
		}
	}
	return ""
}

// TestReplicasShareOnePostgres: two control-plane replicas on one
// PostgreSQL database. The agent's session is on replica B; the run is
// submitted to replica A; its command must reach the node through the
// database's signals, not by waiting out a poll (the replicas' idle periods
// are set to 30s here, so only a signal makes this quick), and exactly one
// replica schedules.
func TestReplicasShareOnePostgres(t *testing.T) {
	dsn := postgresDSN(t)
	c := startCluster(t) // for the registry and the workload image
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
	c.waitFor("node ready via replica A", func() bool {
		n, err := a.client.GetNode(c.ctx, nodeID)
		return err == nil && n.Status == api.NodeReady && n.Facts != nil
	})
	c.waitFor("one leader", func() bool {
		la, lb := leaderGauge(t, a), leaderGauge(t, b)
		return (la == "1") != (lb == "1")
	})

	start := time.Now()
	run, err := a.client.SubmitRun(c.ctx, api.RunSpec{Image: c.workload, Command: []string{"echo", "replicated"}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer wcancel()
	done, err := b.client.WaitRun(wctx, run.ID)
	if err != nil || done.Status != api.RunSucceeded {
		t.Fatalf("run via two replicas: %v %s %q", err, done.Status, done.Reason)
	}
	t.Logf("submitted on A, session on B: succeeded in %v", time.Since(start).Round(time.Millisecond))
	var logs strings.Builder
	if err := a.client.Logs(c.ctx, run.ID, false, &logs); err != nil || !strings.Contains(logs.String(), "replicated") {
		t.Fatalf("logs via A: %v %q", err, logs.String())
	}
}
