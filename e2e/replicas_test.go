package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/internal/pgtest"
)

// postgresDSN is a fresh schema on the test PostgreSQL server (package
// pgtest); in CI a missing server fails the test.
func postgresDSN(t *testing.T) string { return pgtest.FreshSchema(t) }

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
			Config: controlplane.Config{Lease: 5 * time.Second, KeepAlive: replicaKeepAlive, ReconcileEvery: replicaReconcile},
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
	return metricSeries(t, r.url, r.token, "mercator_scheduler_leader")
}

// The replicas' periods in TestReplicasShareOnePostgres. keepAlive stays
// under the agent's session watchdog (nodeagent's sessionIdle, 30 s), so
// the agent never reopens its session on its own. sessionPoll is how many
// keep-alives a session stream lets pass before it reads the store again
// when nothing wakes it (package controlplane's sessionPoll, 30), so without a signal
// a command reaches an open session no sooner than keepAlive×sessionPoll
// after the session last read the store.
//
// The reconcile period is the default's second: the test measures how a
// committed command crosses replicas, not how soon the leader places. A
// long period let a placement that found the node not yet placeable (its
// session just moved) wait out the timer, 30 s, which read as a lost
// signal. It cannot hide one: a wake the leader sends a session on another
// replica travels by the same signal.
const (
	replicaKeepAlive   = 20 * time.Second
	replicaSessionPoll = 30 * replicaKeepAlive
	replicaReconcile   = time.Second
)

// TestReplicasShareOnePostgres: two control-plane replicas on one
// PostgreSQL database. The run is submitted to the replica that schedules;
// the agent's session is held by the other. Its command must reach the
// node through the database's signals (LISTEN/NOTIFY), not by waiting out
// a poll, and exactly one replica schedules.
//
// The bound is a correctness check, not a performance one: the session is
// opened just before the submission and, unsignalled, reads the store next
// replicaSessionPoll (10 minutes) after it opened, so a run that succeeds within
// half that of the session's opening (the wait's bound) can only have been
// carried by a signal; with signals it takes about a second.
func TestReplicasShareOnePostgres(t *testing.T) {
	dsn := postgresDSN(t)
	c := startCluster(t) // for the registry and the workload image
	a, b := startReplica(t, dsn), startReplica(t, dsn)

	nodeID := uniqueNodeID(t, "rep")
	inv, err := a.client.InviteNode(c.ctx, nodeID, 0)
	if err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(t.TempDir(), "agent")
	stop := replicaAgent(t, c, b, nodeID, stateDir, inv.Token)
	t.Cleanup(func() { removeContainers(t, []string{nodeID}) })
	c.waitFor("one leader", func() bool {
		la, lb := leaderGauge(t, a), leaderGauge(t, b)
		return (la == "1") != (lb == "1")
	})
	leader, follower := a, b
	if leaderGauge(t, b) == "1" {
		leader, follower = b, a
	}
	// The session moves to the follower: the agent resumes on the same
	// state, with no invitation.
	stop()
	opened := time.Now()
	replicaAgent(t, c, follower, nodeID, stateDir, "")

	run, err := leader.client.SubmitRun(c.ctx, api.RunSpec{Image: c.workload, Command: []string{"echo", "replicated"}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(c.ctx, replicaSessionPoll/2)
	defer wcancel()
	done, err := follower.client.WaitRun(wctx, run.ID)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the run did not end within %v of the session's opening, although a signal carries its command in about a second: the leader's signal did not reach the follower (the session's own poll is %v)", replicaSessionPoll/2, replicaSessionPoll)
	}
	if err != nil || done.Status != api.RunSucceeded {
		t.Fatalf("run via two replicas: %v %s %q", err, done.Status, done.Reason)
	}
	t.Logf("submitted on the leader, session on the follower: succeeded %v after the session opened", time.Since(opened).Round(time.Millisecond))
	var logs strings.Builder
	if err := leader.client.Logs(c.ctx, run.ID, false, &logs); err != nil || !strings.Contains(logs.String(), "replicated") {
		t.Fatalf("logs via the leader: %v %q", err, logs.String())
	}

	// A keyed submission sent again to the other replica, with the same
	// credential (its first answer lost, as when a replica dies after
	// committing): the first call's run, created once.
	key := client.IdempotencyKey(client.NewIdempotencyKey())
	spec := api.RunSpec{Image: c.workload, Command: []string{"echo", "once"}}
	first, err := leader.client.SubmitRun(c.ctx, spec, key)
	if err != nil {
		t.Fatal(err)
	}
	again, err := client.New(follower.url, leader.token, nil).SubmitRun(c.ctx, spec, key)
	if err != nil || again.ID != first.ID {
		t.Fatalf("the keyed submission sent again to the other replica: run %s, %v; want the first call's %s", again.ID, err, first.ID)
	}
	list, err := follower.client.ListRuns(c.ctx, client.ListRunsOptions{})
	if err != nil || len(list.Runs) != 2 {
		t.Fatalf("%d runs listed (%v), want 2: the first run and the keyed one, once", len(list.Runs), err)
	}
}

// replicaAgent runs an agent for nodeID with its session on replica r and
// waits until r holds the node ready with facts. It returns what stops the
// agent and waits for it.
func replicaAgent(t *testing.T, c *cluster, r *replicaProc, nodeID, stateDir, invitation string) (stop func()) {
	ctx, cancel := context.WithCancel(c.ctx)
	done := make(chan error, 1)
	go func() {
		done <- daemon.RunAgent(ctx, daemon.AgentOptions{ControlPlaneURL: r.url, NodeID: nodeID,
			StateDir: stateDir, Invitation: invitation, Heartbeat: time.Second, Logger: testLogger(t)})
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	c.waitFor("node ready via "+r.url, func() bool {
		n, err := r.client.GetNode(c.ctx, nodeID)
		return err == nil && n.Status == api.NodeReady && n.Facts != nil
	})
	return stop
}

// TestReplicasShareContent: two replicas on one PostgreSQL database with
// the default content store. An Artifact pushed through replica A is
// mounted by a run whose node holds its session on replica B, so B mints
// the node's read and serves it: the content must be B's to serve (it is
// kept in the shared database), not in A's data directory alone.
func TestReplicasShareContent(t *testing.T) {
	dsn := postgresDSN(t)
	c := startCluster(t) // for the registry and the workload image
	a, b := startReplica(t, dsn), startReplica(t, dsn)

	nodeID := uniqueNodeID(t, "repc")
	inv, err := b.client.InviteNode(c.ctx, nodeID, 0)
	if err != nil {
		t.Fatal(err)
	}
	replicaAgent(t, c, b, nodeID, filepath.Join(t.TempDir(), "agent"), inv.Token)
	t.Cleanup(func() { removeContainers(t, []string{nodeID}) })

	data := []byte(strings.Repeat("pushed through replica A\n", 100_000))
	v, err := a.client.PushArtifact(c.ctx, "pgfile", client.BytesPayload(data, sha256Hex(data), api.ArtifactFile), client.PushOptions{})
	if err != nil {
		t.Fatal(err)
	}
	run, err := b.client.SubmitRun(c.ctx, api.RunSpec{Image: c.workload, Command: []string{"sha256", "/d"},
		Artifacts: []api.ArtifactMount{{Name: "pgfile", MountPath: "/d"}}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer wcancel()
	done, err := b.client.WaitRun(wctx, run.ID)
	if err != nil || done.Status != api.RunSucceeded {
		t.Fatalf("a run on replica B's node mounting content pushed through A: %v %s %q %s", err, done.Status, done.Reason, attemptErrors(done))
	}
	var logs strings.Builder
	if err := b.client.Logs(c.ctx, run.ID, false, &logs); err != nil || !strings.Contains(logs.String(), v.SHA256) {
		t.Fatalf("the run printed %q (%v), want the pushed content's digest %s", logs.String(), err, v.SHA256)
	}
}
