package fleetsim

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestShortFleet is the simulator's short mode, for CI: 200 nodes with a
// 1s heartbeat and a 5s lease held for 20s against a control plane on
// SQLite, while 400 runs are submitted. It checks correctness alone: every
// node enrolled and opened a session (Run fails otherwise), every run was
// submitted and reached running, each launch performed exactly once, no
// agent stopped. Lease lapses are logged, not gated: on a shared two-core
// machine a heartbeat late by a lease measures the machine's load, not a
// defect, and rates belong in `mercator bench fleet`, which measures the
// full figures (10,000 nodes and more) by hand.
func TestShortFleet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := Run(ctx, Config{
		Nodes: 200, Duration: 20 * time.Second, Heartbeat: time.Second, Lease: 5 * time.Second,
		Runs: 400, RunRate: 40, RunTime: 5 * time.Second, RunsTimeout: 30 * time.Second,
		Dir: t.TempDir(), Progress: &progress,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	var report bytes.Buffer
	rep.WriteText(&report)
	t.Logf("\n%s", report.String())
	t.Logf("missed leases: %d (lapses %d, unreachable at the end %d, agents' gaps %d)",
		rep.MissedLeases, rep.LeaseLapses, rep.UnreachableAtEnd, rep.HeartbeatLapses)
	if rep.RunsSubmitted != 400 || rep.SubmitErrors != 0 || rep.RunsRunning != rep.RunsSubmitted {
		t.Errorf("%d runs submitted (%d failed), %d reached running", rep.RunsSubmitted, rep.SubmitErrors, rep.RunsRunning)
	}
	if rep.LaunchesDuplicated != 0 || rep.LaunchesMissing != 0 {
		t.Errorf("launches performed twice: %d; never performed: %d", rep.LaunchesDuplicated, rep.LaunchesMissing)
	}
	if rep.Commands < int64(rep.RunsSubmitted) || rep.CommandDeliveryP99MS <= 0 {
		t.Errorf("%d commands delivered, p99 %.1f ms", rep.Commands, rep.CommandDeliveryP99MS)
	}
	if rep.AgentsStopped != 0 {
		t.Errorf("%d agents stopped: %v", rep.AgentsStopped, rep.LogSamples)
	}
}

// TestMain lets the test binary stand in for `mercator bench fleet-shard`:
// started with FLEETSIM_SHARD=1 it runs one shard on its stdin and stdout.
func TestMain(m *testing.M) {
	if os.Getenv("FLEETSIM_SHARD") == "1" {
		if err := RunShard(context.Background(), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestShardedFleet runs the agents in two child processes (the test binary
// itself, see TestMain), which is how fleets larger than one process's
// open-file limit are simulated: what the shards observe must reach the
// parent's figures (some heartbeats counted, every launch once; how many
// heartbeats a second, and whether every lease held, are the machine's
// speed, not a check). Its runs go 7 to a call through the batch route (the
// last call carries the remaining 3), which TestShortFleet's single
// submissions leave untested.
func TestShardedFleet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	rep, err := Run(ctx, Config{
		Nodes: 40, Duration: 5 * time.Second, Heartbeat: time.Second, Lease: 5 * time.Second,
		Runs: 80, SubmitBatch: 7, RunTime: 2 * time.Second, RunsTimeout: 30 * time.Second,
		AgentProcesses: 2, ShardCommand: []string{"env", "FLEETSIM_SHARD=1", exe, "-test.run=^$"},
		Dir: t.TempDir(), Progress: &progress,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	// The shards' heartbeats must reach the parent's figures (a count, not
	// a rate: how many per second measures the machine).
	if rep.AgentProcesses != 2 || rep.RunsRunning != 80 || rep.LaunchesDuplicated != 0 || rep.LaunchesMissing != 0 ||
		rep.HeartbeatsPerS <= 0 || rep.Commands < 80 || rep.RunsSubmitted != 80 || rep.SubmitErrors != 0 || rep.SubmitBatch != 7 {
		var report bytes.Buffer
		rep.WriteText(&report)
		t.Errorf("sharded fleet:\n%s\n%s", report.String(), progress.String())
	}
}
