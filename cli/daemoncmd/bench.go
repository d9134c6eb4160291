package daemoncmd

import (
	"context"
	"io"
	"net/http"
	_ "net/http/pprof" // --debug-addr serves the profiles
	"os"
	"time"

	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/fleetsim"
)

// This file holds the benchmark commands. `bench fleet` is flags and wiring
// around fleetsim.Run.

// registerBench adds the `bench` group through registerSub (see Register).
func registerBench(registerSub func(group, groupSummary string, c *command.Command)) {
	registerSub("bench", "Measure Mercator on this machine", &command.Command{Name: "fleet",
		Summary: "Simulate a fleet of nodes against a real control plane in this process", Run: benchFleet})
	registerSub("bench", "Measure Mercator on this machine", &command.Command{Name: "fleet-shard",
		Summary: "Run a share of bench fleet's simulated agents (bench fleet starts it; not for direct use)", Run: benchFleetShard})
}

// agentsPerProcess is how many simulated agents one agent process gets by
// default: each holds its state file and, over HTTP/1.1, a connection, and
// on the machine these defaults were measured on, the hard open-file limit
// (20000) could not be raised.
const agentsPerProcess, agentsPerProcessHTTP2 = 4000, 15000

func benchFleetShard(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("", `
Run a share of the simulated agents of `+"`mercator bench fleet`"+`, which starts this
command itself: it reads the share's description as one JSON line on stdin
and writes what its agents observe as JSON lines on stdout, until stdin is
closed.`)
	if pos, err := fs.Parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return command.Usagef("unexpected argument %q", pos[0])
	}
	return fleetsim.RunShard(ctx, inv.Stdin, inv.Stdout)
}

func benchFleet(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("--nodes N [flags]", `
Start a real control plane (SQLite, or --db postgres://… with --replicas K)
serving HTTPS with a CA made for the run, and N simulated nodes: the real agent
over the real node protocol, verifying the CA its invitation pins, with an
in-memory container runtime. Hold the fleet for --duration while submitting
--runs runs, then report enrollments, heartbeats, missed leases, command
delivery, submission to running, placements, connections and TLS handshakes,
CPU and memory. Agents run in child processes (`+"`bench fleet-shard`"+`), 4,000
each by default; past ~18,000 nodes the open-file limit needs --http2.
--kill-replica-at kills replica 0 mid-hold as a crash would (--kill-leader: the
replica that leads the scheduling); --storm-at drops
every connection at once so the whole fleet reconnects together; --plaintext
runs over plain HTTP; --compare-plaintext runs over TLS, then in plaintext, and
reports both side by side. Choices that change the figures (--no-fsync,
--http2, --plaintext) are labelled in the report. Progress goes to stderr.`)
	nodes := fs.Int("nodes", 0, "how many nodes to simulate")
	duration := fs.Duration("duration", time.Minute, "how long to hold the fleet once every node is in session")
	db := fs.String("db", "", "store `URL`: postgres://USER:PASSWORD@HOST/DB (default SQLite in a temporary directory)")
	replicas := fs.Int("replicas", 1, "control-plane replicas sharing --db (more than one needs PostgreSQL)")
	heartbeat := fs.Duration("heartbeat", 10*time.Second, "the agents' heartbeat")
	lease := fs.Duration("lease", 30*time.Second, "the control plane's lease")
	runs := fs.Int("runs", 0, "runs to submit during the hold")
	rate := fs.Float64("run-rate", 0, "runs submitted a second (0: as fast as the submitters go)")
	submitters := fs.Int("submitters", 32, "concurrent submitting clients")
	submitBatch := fs.Int("submit-batch", 1, "runs per submission call: 1 submits each with POST /v1/runs, more (up to 1000) through POST /v1/runs/batch")
	upgradeAt := fs.Duration("upgrade-at", 0, "start a rollout of every node to a new agent release this long into the hold (node upgrade --all); the hold lasts until it ends")
	upgradeParallel := fs.Int("upgrade-parallel", 100, "nodes upgraded at a time in that rollout (--max-parallel)")
	projects := fs.Int("projects", 0, "split the fleet into this many projects' quotas and submit the runs to them in turn, a quarter at a higher priority (labelled in the report)")
	startTime := fs.Duration("start-time", 100*time.Millisecond, "how long a simulated container takes to start")
	runTime := fs.Duration("run-time", 0, "how long a simulated container runs (0: until the end)")
	runsTimeout := fs.Duration("runs-timeout", 10*time.Minute, "how long the hold may be extended for runs not yet running")
	noFsync := fs.Bool("no-fsync", false, "simulated agents skip fsync on their state (labelled in the report)")
	kill := fs.Duration("kill-replica-at", 0, "kill replica 0 this long into the hold (needs --replicas 2 or more)")
	killLeader := fs.Bool("kill-leader", false, "--kill-replica-at kills the replica that leads the scheduling, and the report says how soon another led and placed, and whether any node was over-committed")
	runCPU := fs.Float64("run-cpu", 0, "CPUs each run asks for (default 0.5; a simulated node has 64): 6.4 fills 10,000 nodes with exactly 100,000 runs")
	storm := fs.Duration("storm-at", 0, "drop every connection of every replica this long into the hold: the whole fleet reconnects at once")
	plaintext := fs.Bool("plaintext", false, "serve and speak plain HTTP on loopback instead of TLS (labelled in the report)")
	compare := fs.Bool("compare-plaintext", false, "run the simulation over TLS, then again in plaintext, and report both side by side")
	enroll := fs.Int("enroll-concurrency", 200, "how many agents may be enrolling at once")
	writeConc := fs.Int("write-concurrency", 0, "the control plane's concurrent batched write transactions (0: the default for the store)")
	writeBatch := fs.Int("write-batch", 0, "callers one batched write transaction carries at most (0: the default for the store)")
	procs := fs.Int("agent-processes", -1, "child processes running the agents (0: in this process; default: one per 4000 nodes, 15000 with --http2)")
	http2 := fs.Bool("http2", false, "agents speak plaintext HTTP/2, multiplexing their streams, instead of HTTP/1.1 with a connection each (labelled in the report)")
	cpuProfile := fs.String("cpuprofile", "", "write the hold's CPU profile to `file` (goroutines labelled by component); with --kill-leader or --storm-at the window is written apart, to file.takeover or file.storm, and the rest of the hold to file.after")
	debugAddr := fs.String("debug-addr", "", "serve Go's /debug/pprof on this `address` while the simulation runs")
	heapProfile := fs.String("memprofile", "", "write this process's heap profile to `file` when the hold ends")
	output := fs.String("output", "table", "output `format`: table or json")
	fs.AliasShort("o", "output")
	if pos, err := fs.Parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return command.Usagef("unexpected argument %q", pos[0])
	}
	if *nodes <= 0 {
		return command.Usagef("--nodes must be positive")
	}
	if *output != "table" && *output != "json" {
		return command.Usagef("--output must be table or json, not %q", *output)
	}
	if *debugAddr != "" {
		go http.ListenAndServe(*debugAddr, nil) // the default mux holds net/http/pprof's handlers
	}
	if *procs < 0 {
		per := agentsPerProcess
		if *http2 {
			per = agentsPerProcessHTTP2
		}
		*procs = (*nodes + per - 1) / per
	}
	var shardCmd []string
	if *procs > 0 {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		shardCmd = []string{exe, "bench", "fleet-shard"}
	}
	cfg := fleetsim.Config{
		AgentProcesses: *procs, ShardCommand: shardCmd, HTTP2: *http2, Plaintext: *plaintext,
		Nodes: *nodes, Duration: *duration, DB: *db, Replicas: *replicas, Heartbeat: *heartbeat, Lease: *lease,
		Runs: *runs, RunRate: *rate, Submitters: *submitters, SubmitBatch: *submitBatch, Projects: *projects, UpgradeAt: *upgradeAt, UpgradeParallel: *upgradeParallel, StartTime: *startTime, RunTime: *runTime, RunsTimeout: *runsTimeout,
		NoFsync: *noFsync, KillReplicaAt: *kill, KillLeader: *killLeader, RunCPU: *runCPU, StormAt: *storm, EnrollConcurrency: *enroll, WriteConcurrency: *writeConc, WriteBatch: *writeBatch, Progress: inv.Stderr, CPUProfile: *cpuProfile, HeapProfile: *heapProfile,
	}
	var rep interface{ WriteText(io.Writer) }
	var err error
	if *compare {
		rep, err = fleetsim.Compare(ctx, cfg)
	} else {
		rep, err = fleetsim.Run(ctx, cfg)
	}
	if err != nil {
		return err
	}
	if *output == "json" {
		return inv.WriteJSON(rep)
	}
	rep.WriteText(inv.Stdout)
	return nil
}
