package fleetsim

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
)

// TestShortFleet is the simulator's short mode, for CI: 200 nodes with a
// 1s heartbeat and a 60s lease held for 24s against a control plane on
// SQLite over TLS (the default: a CA made for the run, every agent
// verifying the replica against the CA its invitation pins), while 400
// runs are submitted, with a reconnect storm 8s into the hold: the replica
// drops every connection at once. It checks correctness alone: every node
// enrolled and opened a session (Run fails otherwise), every run was
// submitted and reached running, each launch performed exactly once, no
// agent stopped, every node came back from the storm and none missed its
// lease (the lease is 60 heartbeats, far beyond what the storm takes even
// under the race detector on a loaded machine, about 20s: a node that
// misses it did not come back, a defect, not the machine's load), and the
// reconnects were TLS handshakes, some of them resumed sessions. How fast is not
// checked: rates belong in `mercator bench fleet`, which measures the full
// figures (10,000 nodes and more) by hand.
func TestShortFleet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := Run(ctx, Config{
		Nodes: 200, Duration: 24 * time.Second, Heartbeat: time.Second, Lease: time.Minute, StormAt: 8 * time.Second,
		Runs: 400, RunRate: 40, RunTime: 5 * time.Second, RunsTimeout: 30 * time.Second,
		Dir: t.TempDir(), Progress: &progress,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	var report bytes.Buffer
	rep.WriteText(&report)
	t.Logf("\n%s", report.String())
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
	if rep.MissedLeases != 0 || rep.HeartbeatLapses != 0 {
		t.Errorf("missed leases: %d (lapses %d, unreachable at the end %d); agents' gaps over the lease: %d",
			rep.MissedLeases, rep.LeaseLapses, rep.UnreachableAtEnd, rep.HeartbeatLapses)
	}
	if !rep.TLS || rep.UpConnections.FullHandshakes == 0 {
		t.Errorf("the fleet did not come up over TLS: tls %v, %s", rep.TLS, rep.UpConnections)
	}
	st := rep.Storm
	switch {
	case st == nil:
		t.Fatal("no reconnect storm in the report")
	case st.Nodes != 200 || st.Back != 200 || st.NotBack != 0 || st.Dropped < 200:
		t.Errorf("reconnect storm: %s", st)
	case st.LeaseLapses != 0:
		t.Errorf("leases lapsed in the reconnect storm: %s", st)
	case st.Connections.FullHandshakes+st.Connections.ResumedHandshakes < 200 || st.Connections.ResumedHandshakes == 0:
		t.Errorf("the storm's reconnects were not TLS handshakes, some resumed: %s", st)
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
// submissions leave untested. It runs over TLS, the shards reading the
// run's CA from the spec, and in plaintext, the mode TLS is compared with:
// there, no handshake.
func TestShardedFleet(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, plaintext := range []bool{false, true} {
		t.Run(fmt.Sprintf("plaintext=%v", plaintext), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var progress bytes.Buffer
			// In plaintext the runs also go to three projects (projects.go):
			// a submission to a project that was not created would fail.
			// Over TLS the fleet is also upgraded to a new agent release
			// (upgrade.go): every agent fetches it through its minted read,
			// checks it and is replaced by one reporting the new version.
			projects, upgradeAt := 0, time.Second
			if plaintext {
				projects, upgradeAt = 3, 0
			}
			rep, err := Run(ctx, Config{
				Nodes: 40, Duration: 5 * time.Second, Heartbeat: time.Second, Lease: 5 * time.Second, Plaintext: plaintext,
				Runs: 80, SubmitBatch: 7, RunTime: 2 * time.Second, RunsTimeout: 30 * time.Second, Projects: projects, UpgradeAt: upgradeAt, UpgradeParallel: 10,
				AgentProcesses: 2, ShardCommand: []string{"env", "FLEETSIM_SHARD=1", exe, "-test.run=^$"},
				Dir: t.TempDir(), Progress: &progress,
			})
			if err != nil {
				t.Fatalf("%v\n%s", err, progress.String())
			}
			// The shards' heartbeats must reach the parent's figures (a count, not
			// a rate: how many per second measures the machine).
			handshakes := rep.UpConnections.FullHandshakes
			if rep.AgentProcesses != 2 || rep.RunsRunning != 80 || rep.LaunchesDuplicated != 0 || rep.LaunchesMissing != 0 ||
				rep.HeartbeatsPerS <= 0 || rep.Commands < 80 || rep.RunsSubmitted != 80 || rep.SubmitErrors != 0 || rep.SubmitBatch != 7 ||
				rep.TLS == plaintext || (handshakes == 0) != plaintext || rep.UpConnections.Accepted < 40 ||
				(!plaintext && (rep.Upgrade == nil || rep.Upgrade.State != api.RolloutSucceeded || rep.Upgrade.Upgraded != 40)) {
				var report bytes.Buffer
				rep.WriteText(&report)
				t.Errorf("sharded fleet:\n%s\n%s", report.String(), progress.String())
			}
		})
	}
}

// TestForCall: with projects, call k's runs go to project k mod Projects
// and every fourth call's at priority 10; without, the spec is unchanged.
func TestForCall(t *testing.T) {
	spec := api.RunSpec{Image: "x"}
	if got := forCall(Config{}, spec, 5); got.Project != "" || got.Priority != 0 {
		t.Errorf("without projects: %+v", got)
	}
	cfg := Config{Projects: 3}
	for k, want := range map[int][2]any{0: {"team-00", 10}, 1: {"team-01", 0}, 5: {"team-02", 0}, 8: {"team-02", 10}} {
		got := forCall(cfg, spec, k)
		if got.Project != want[0] || got.Priority != want[1] {
			t.Errorf("call %d: project %q priority %d, want %v", k, got.Project, got.Priority, want)
		}
	}
}
