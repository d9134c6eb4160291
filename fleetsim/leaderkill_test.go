package fleetsim

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"
)

// TestLeaderKilled: two replicas on PostgreSQL, the one that leads the
// scheduling killed one second into a hold while runs keep arriving. Runs
// ask for a tenth of a node each, so the 600 runs fill the 60 nodes exactly:
// a second leader placing from a stale view would leave a node holding more
// than it has. Every run must reach running, launched once, with no node
// over-committed, and another replica must lead and place after the kill.
// How soon is the benchmark's to say (`bench fleet --kill-leader`).
func TestLeaderKilled(t *testing.T) {
	dsn := os.Getenv("MERCATOR_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("MERCATOR_TEST_POSTGRES is not set (scripts/ensure-postgres.sh prints one)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := Run(ctx, Config{
		Nodes: 60, Duration: 10 * time.Second, Heartbeat: time.Second, Lease: 10 * time.Second,
		DB: dsn, Replicas: 2, KillReplicaAt: time.Second, KillLeader: true,
		Runs: 600, RunRate: 60, RunCPU: 6.4, RunsTimeout: time.Minute,
		Dir: t.TempDir(), Progress: &progress,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	var report bytes.Buffer
	rep.WriteText(&report)
	t.Logf("\n%s", report.String())
	k := rep.Kill
	switch {
	case k == nil || !k.Leader:
		t.Fatal("the report has no killed leader")
	case k.OverCommitted != 0 || k.RunsChecked != 600:
		t.Errorf("%d nodes over-committed, %d runs checked (want 0 of 600)", k.OverCommitted, k.RunsChecked)
	case k.PlacementsAfter == 0 || k.FirstPlacementMS <= 0 || k.NewLeaderMS <= 0:
		t.Errorf("no other replica led and placed after the kill: %+v", k)
	case k.FirstPlacementMS < k.NewLeaderMS || k.NewLeaderSeenMS < k.NewLeaderMS || k.FirstPlacementSeenMS < k.FirstPlacementMS:
		t.Errorf("the takeover's times out of order (placed before leading, or seen before it happened): %+v", k)
	}
	if rep.RunsRunning != 600 || rep.LaunchesDuplicated != 0 || rep.LaunchesMissing != 0 {
		t.Errorf("%d of 600 runs running; launches performed twice %d, never %d", rep.RunsRunning, rep.LaunchesDuplicated, rep.LaunchesMissing)
	}
}
