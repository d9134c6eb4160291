// Package fleetsim simulates a fleet of machines against a real control
// plane, in one process, to measure the control plane at scale: how fast
// nodes enroll, whether every node keeps its lease while thousands
// heartbeat, how long a command takes to reach its node, and how many runs
// a second go from submission to running.
//
// Only the machines are simulated. Each simulated node runs the real agent
// (nodeagent.Agent, with its own nodeagent.State in a bbolt file of its own)
// over the real node protocol (nodeagent.HTTPTransport, HTTP/1.1, one
// session stream per node on a connection of its own) against real
// control-plane replicas (daemon.RunServer on SQLite, or on PostgreSQL with
// several replicas), over HTTPS by default: the replicas serve a
// certificate from a CA made for the run and every agent verifies it
// against the CA its invitation pins, resuming TLS sessions as a real agent
// does (tls.go; Config.Plaintext is the plain-HTTP baseline). A reconnect
// storm (Config.StormAt, storm.go) drops every connection at once and
// measures the fleet coming back, handshakes counted on the server.
// Submissions go through the public API and are pinned
// against a real registry on loopback. What is simulated is the container
// runtime: Runtime pretends to pull and run containers, with configurable
// start and run times, and records every launch it performs, which is how
// the simulator checks that no command was performed twice.
//
// Everything shares one machine, so the figures are those of a control
// plane that gets only part of the machine's cores: the report says how
// many cores there were and how the CPU time split between the control
// plane, the simulated agents and the Go runtime (from a CPU profile whose
// samples are labelled by component). The simulated agents normally fsync
// their state as real agents do; Config.NoFsync turns that off for runs
// where thousands of agents' fsyncs on one disk would measure the disk
// rather than the control plane, and the report then says so.
//
// A process holds only so many open files (on the machine these figures
// were measured on, 20,000, a hard limit no process may raise), and every
// agent holds its state file and a connection whose other end the control
// plane holds. So the agents can run in child processes (Config.
// AgentProcesses, shard.go), which also leaves the control plane alone in
// the parent, its CPU and memory its own; and they can speak HTTP/2
// (Config.HTTP2), multiplexing their streams over a few
// connections, which the report labels.
//
// Run is what `mercator bench fleet` (package cli) and this package's test
// call. Nothing in a production path imports fleetsim.
package fleetsim

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/cputime"
	"github.com/mercator/mercator/internal/registrytest"
	"github.com/mercator/mercator/store/sqlstore"
)

// Config is one simulation. Zero values take the defaults named on each
// field.
type Config struct {
	// Nodes is how many machines to simulate (required).
	Nodes int
	// Duration is how long the fleet is held once every node is in
	// session (default 1m). The hold also lasts until every submitted run
	// is running, for at most RunsTimeout more.
	Duration time.Duration
	// DB is the control plane's store: "" for SQLite in a temporary
	// directory, or a postgres:// URL, in whose database the simulation
	// makes a schema of its own and drops it at the end.
	DB string
	// Replicas is how many control-plane replicas share DB (default 1;
	// more than one needs PostgreSQL). Nodes are spread over them.
	Replicas int
	// Heartbeat is the agents' heartbeat (default 10s) and Lease the
	// control plane's lease (default 30s).
	Heartbeat time.Duration
	Lease     time.Duration
	// Runs is how many runs to submit during the hold, RunRate how many a
	// second (0: as fast as Submitters concurrent clients go).
	Runs       int
	RunRate    float64
	Submitters int // default 32
	// SubmitBatch is how many runs one submission call carries: 0 or 1
	// submits each run with a POST /v1/runs of its own; more hands the
	// Submitters batches of that many, each one POST /v1/runs/batch
	// (client.SubmitRuns), at most api.MaxRunBatch. A run's submission
	// time is then its call's start, and RunRate paces the calls: a batch
	// is due when its first run is.
	SubmitBatch int
	// Projects, when positive, splits the fleet into that many projects'
	// quotas and submits the runs to them in turn (projects.go).
	Projects int
	// UpgradeAt, when positive, starts a rollout of every node to a new
	// agent release this long into the hold, UpgradeParallel nodes at a
	// time (default 100), and the hold lasts until it ends (upgrade.go).
	UpgradeAt       time.Duration
	UpgradeParallel int
	// RunsTimeout bounds how long the hold is extended for runs not yet
	// running (default 10m).
	RunsTimeout time.Duration
	// RunCPU and RunMemory are each run's request (default 0.5 CPU, 256 MiB).
	RunCPU    float64
	RunMemory int64
	// NodeCPUs and NodeMemory are each simulated node's capacity (default
	// 64 CPUs, 256 GiB).
	NodeCPUs   float64
	NodeMemory int64
	// StartTime and RunTime are how long launching a simulated container
	// takes (default 100ms: the launch returns with it running) and how
	// long it then runs (0: until the simulation ends).
	StartTime time.Duration
	RunTime   time.Duration
	// ObserveEvery is the agents' observation period (default: Heartbeat).
	// The simulated runtime signals every start and exit as it happens, as
	// Docker's event stream does, so the period is only the safety net.
	ObserveEvery time.Duration
	// NoFsync opens every agent's state without fsync
	// (nodeagent.WithoutFsync). The report labels its figures when set.
	NoFsync bool
	// EnrollConcurrency is how many agents may be enrolling at once
	// (default 200): a real fleet does not boot in the same millisecond.
	EnrollConcurrency int
	// KillReplicaAt, when positive, kills replica 0 that long into the
	// hold (needs Replicas > 1); its nodes must move to another replica
	// within their lease. Submissions go only to the other replicas.
	KillReplicaAt time.Duration
	// KillLeader makes KillReplicaAt kill the replica that leads the
	// scheduling when the replicas are up, not replica 0, and report how
	// the leadership moved and that nothing was over-committed
	// (leaderkill.go).
	KillLeader bool
	// StormAt, when positive, drops every connection every replica
	// accepted that long into the hold, all at once, the listeners still
	// accepting: every node reconnects at the same moment (a reconnect
	// storm). The report says how they came back (Report.Storm).
	StormAt time.Duration
	// Plaintext makes the replicas serve plain HTTP on loopback and the
	// agents speak it, instead of HTTPS with a CA made for the run that
	// every agent verifies (the default, as the product runs): the
	// baseline the TLS figures are compared with. Labelled in the report.
	Plaintext bool
	// AgentProcesses is how many child processes run the agents, each a
	// share of the fleet (0: the agents run in this process). A process
	// may hold only so many open files, and each agent holds its state
	// file and a connection whose other end the control plane holds; in
	// child processes the agents also stop sharing the control plane's
	// CPU accounting and memory. Needs ShardCommand.
	AgentProcesses int
	// ShardCommand starts one agent process: a command that calls
	// RunShard with its stdin and stdout (`mercator bench fleet-shard`).
	ShardCommand []string
	// HTTP2 makes the agents speak HTTP/2 (over TLS by ALPN; with
	// Plaintext, with prior knowledge), multiplexing their streams over a
	// few connections per agent process, instead of one HTTP/1.1 connection each: how a fleet
	// larger than the open-file limit allows still fits. Labelled in the
	// report.
	HTTP2 bool
	// WriteConcurrency and WriteBatch are the control plane's
	// (controlplane.Config): how many batched write transactions run at
	// once, and how many callers each carries. Zero is the daemon's
	// default for the store. For measuring the group commit's shape.
	WriteConcurrency, WriteBatch int
	// Dir is the working directory (default: a temporary one, removed at
	// the end).
	Dir string
	// Progress, when set, receives a line now and then.
	Progress io.Writer
	// CPUProfile, when set, is a file to write the hold's CPU profile to
	// (goroutines labelled component=controlplane|agents|submitter|registry);
	// each agent process writes its own, over its whole life, to
	// CPUProfile+".agents.N". A leader's takeover (KillLeader) and a
	// reconnect storm (StormAt) are profiled apart, into
	// CPUProfile+".takeover" or ".storm", and the hold after them into
	// CPUProfile+".after" (package phaseprofile).
	CPUProfile string
	// HeapProfile, when set, is a file to write this process's heap
	// profile to when the hold ends.
	HeapProfile string
}

func (c *Config) defaults() error {
	if c.Nodes <= 0 {
		return failure.Invalid("nodes", "the number of nodes must be positive")
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Duration, time.Minute)
	def(&c.Heartbeat, 10*time.Second)
	def(&c.Lease, 30*time.Second)
	def(&c.RunsTimeout, 10*time.Minute)
	def(&c.StartTime, 100*time.Millisecond)
	def(&c.ObserveEvery, c.Heartbeat)
	c.Replicas = cmp.Or(c.Replicas, 1)
	c.Submitters = cmp.Or(c.Submitters, 32)
	c.RunCPU = cmp.Or(c.RunCPU, 0.5)
	c.RunMemory = cmp.Or(c.RunMemory, 256<<20)
	c.NodeCPUs = cmp.Or(c.NodeCPUs, 64)
	c.NodeMemory = cmp.Or(c.NodeMemory, 256<<30)
	c.EnrollConcurrency = cmp.Or(c.EnrollConcurrency, 200)
	switch {
	case c.Replicas > 1 && !c.postgres():
		return failure.Invalid("replicas", "several replicas need a shared PostgreSQL store (--db postgres://…)")
	case c.StormAt < 0 || (c.StormAt > 0 && c.StormAt >= c.Duration):
		return failure.Invalid("storm-at", "the reconnect storm must come during the hold (%s), not at %s", c.Duration, c.StormAt)
	case c.KillReplicaAt > 0 && c.Replicas < 2:
		return failure.Invalid("kill-replica-at", "killing a replica needs at least two")
	case c.KillLeader && c.KillReplicaAt <= 0:
		return failure.Invalid("kill-leader", "says which replica --kill-replica-at kills; give --kill-replica-at too")
	case c.RunCPU < 0 || c.RunCPU > c.NodeCPUs:
		return failure.Invalid("run-cpu", "%g CPUs: a run must fit a simulated node (%g CPUs)", c.RunCPU, c.NodeCPUs)
	case c.AgentProcesses > 0 && len(c.ShardCommand) == 0:
		return failure.Invalid("agent-processes", "agent processes need a command that runs a shard")
	case c.Heartbeat >= c.Lease:
		return failure.Invalid("heartbeat", "the heartbeat (%s) must be shorter than the lease (%s)", c.Heartbeat, c.Lease)
	case c.SubmitBatch < 0 || c.SubmitBatch > api.MaxRunBatch:
		return failure.Invalid("submit-batch", "runs a submission call carries must be from 0 (one) to %d, not %d", api.MaxRunBatch, c.SubmitBatch)
	case c.Projects < 0 || c.Projects > 100:
		return failure.Invalid("projects", "projects must be from 0 (none) to 100, not %d", c.Projects)
	case c.WriteConcurrency < 0 || c.WriteConcurrency > 64 || c.WriteBatch < 0 || c.WriteBatch > 1024:
		return failure.Invalid("write-concurrency", "write concurrency must be from 0 (the default) to 64 and the write batch from 0 (the default) to 1024, not %d and %d", c.WriteConcurrency, c.WriteBatch)
	case c.UpgradeAt < 0 || c.UpgradeParallel < 0:
		return failure.Invalid("upgrade-at", "the upgrade's start and its parallelism must not be negative")
	}
	if c.UpgradeParallel == 0 {
		c.UpgradeParallel = 100
	}
	c.SubmitBatch = max(1, c.SubmitBatch)
	return nil
}

// postgres reports whether the store is PostgreSQL. Each simulation then
// runs in a schema of its own, dropped at the end (freshSchema).
func (c Config) postgres() bool {
	return sqlstore.IsPostgres(c.DB)
}

// Run runs one simulation and reports what it measured. It returns an
// error when the simulation could not be carried out (a replica did not
// start, nodes could not be invited); what went wrong during the hold
// (missed leases, runs that never ran) is in the Report.
//
// It runs in phases, each a method of sim: the open-file limit and the
// working directory, the registry (startRegistry), the control plane
// (startReplicas), the invitations (invite), the agents (startAgents,
// waitUp), the hold with its submissions and an optional replica kill
// (hold, hold.go), and the report (report, report.go).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &sim{cfg: cfg, start: time.Now()}
	if s.cfg.Progress != nil {
		// The shards' stderr is copied here too, each from its own
		// goroutine.
		s.cfg.Progress = &lockedWriter{w: s.cfg.Progress}
	}
	if err := s.checkOpenFiles(); err != nil {
		return nil, err
	}
	s.dir = s.cfg.Dir
	if s.dir == "" {
		d, err := os.MkdirTemp("", "fleetsim-")
		if err != nil {
			return nil, err
		}
		s.dir = d
		defer os.RemoveAll(s.dir)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	regClose, err := s.startRegistry(ctx)
	if err != nil {
		return nil, err
	}
	defer regClose()
	if s.cfg.postgres() {
		dsn, drop, err := freshSchema(ctx, s.cfg.DB)
		if err != nil {
			return nil, err
		}
		defer drop() // after the replicas stopped (deferred below)
		s.cfg.DB = dsn
	}
	defer s.stopReplicas()
	if err := s.startReplicas(ctx); err != nil {
		return nil, err
	}
	if err := s.invite(ctx); err != nil {
		return nil, err
	}
	defer s.stopAgents()
	if err := s.startAgents(ctx); err != nil {
		return nil, err
	}
	if err := s.waitUp(ctx); err != nil {
		return nil, err
	}
	h, err := s.hold(ctx)
	if err != nil {
		return nil, err
	}
	rep := s.report(ctx, h)
	s.progress("hold done after %.1fs", h.length.Seconds())
	return rep, nil
}

// sim is one simulation in progress: what each phase of Run sets up and
// the later phases use.
type sim struct {
	cfg   Config
	start time.Time
	dir   string
	image string // the runs' image, pushed to the registry

	tls       *runTLS // nil with Config.Plaintext
	replicas  []*replica
	survivors []*replica // the replicas not to be killed
	victim    int        // the index of the one to kill (KillReplicaAt)
	admin     *client.Client
	cpLog     *countingHandler

	ids, tokens []string
	rec         *recorder

	agentLog    *countingHandler
	stopAgentsC context.CancelFunc
	agentsDone  chan struct{}
	agentsErr   error
	shards      []*shardProc

	// With CPUProfile, the fleet coming up is profiled too, into
	// CPUProfile+".up".
	upProfile   bytes.Buffer
	upProfiling bool
	enrollStart time.Time     // when the agents were started
	enrollSpan  time.Duration // from enrollStart to the last enrollment
	fleetUp     time.Duration // until every node was in session
	// The replicas' connections and this process's CPU time when the
	// agents started (…0) and from then until the hold.
	upConns0, upConns connCounts
	upCPU0, upCPU     time.Duration

	metricsClient *http.Client
}

func (s *sim) progress(format string, args ...any) {
	if s.cfg.Progress != nil {
		fmt.Fprintf(s.cfg.Progress, "[%7.1fs] "+format+"\n", append([]any{time.Since(s.start).Seconds()}, args...)...)
	}
}

// checkOpenFiles raises the open-file limit to what this process needs:
// the control plane's end of every agent connection (one each over
// HTTP/1.1) and, when the agents run here, their state files and their
// ends of the connections.
func (s *sim) checkOpenFiles() error {
	cfg := &s.cfg
	conns := uint64(cfg.Nodes) + uint64(cfg.Nodes)/5 // a session each, a shared pool for calls
	switch {
	case cfg.HTTP2:
		conns = 256
	case !cfg.Plaintext:
		conns = uint64(cfg.Nodes) + 64 // one HTTP/2 connection each
	}
	need := conns + 1024
	if cfg.AgentProcesses == 0 {
		need += uint64(cfg.Nodes) + conns
	}
	if got, err := raiseOpenFileLimit(need); got < need {
		return fmt.Errorf("the open-file limit is %d and %d nodes need about %d in this process (each agent holds a state file and, over HTTP/1.1, a connection whose other end the control plane holds): use more agent processes or HTTP/2 (%v)", got, cfg.Nodes, need, err)
	}
	return nil
}

// startRegistry serves the registry the control plane pins the runs' image
// against, and pushes the image. It returns how to close the registry.
func (s *sim) startRegistry(ctx context.Context) (func() error, error) {
	var regHost string
	var regClose func() error
	var err error
	pprof.Do(ctx, pprof.Labels("component", "registry"), func(ctx context.Context) {
		regHost, regClose, err = registrytest.Serve(ctx, "127.0.0.1:0", "")
	})
	if err != nil {
		return nil, err
	}
	if s.image, err = pushImage(ctx, regHost); err != nil {
		regClose()
		return nil, err
	}
	return regClose, nil
}

// startReplicas makes the run's CA and certificate, unless in plaintext,
// and starts the control plane's replicas.
func (s *sim) startReplicas(ctx context.Context) error {
	if !s.cfg.Plaintext {
		t, err := makeRunTLS(s.dir, s.cfg.Replicas)
		if err != nil {
			return fmt.Errorf("the run's CA: %w", err)
		}
		s.tls = t
	}
	s.metricsClient = &http.Client{Transport: s.tls.clientTransport(4)}
	s.cpLog = newCountingHandler(slog.LevelWarn)
	s.replicas = make([]*replica, 0, s.cfg.Replicas)
	for i := range s.cfg.Replicas {
		r, err := startReplica(ctx, &s.cfg, s.tls, s.dir, i, slog.New(s.cpLog))
		if err != nil {
			return err
		}
		s.replicas = append(s.replicas, r)
	}
	s.progress("%d control-plane replica(s) up", len(s.replicas))
	s.survivors = s.replicas
	if s.cfg.KillReplicaAt > 0 {
		if s.cfg.KillLeader {
			i, err := s.waitLeader(ctx)
			if err != nil {
				return err
			}
			s.victim = i
			s.progress("replica %d leads the scheduling: it is the one to kill", i)
		}
		s.survivors = append(append([]*replica(nil), s.replicas[:s.victim]...), s.replicas[s.victim+1:]...)
	}
	s.admin = s.adminClient(s.survivors[0])
	return nil
}

func (s *sim) stopReplicas() {
	for _, r := range s.replicas {
		r.stop(10 * time.Second)
	}
}

// adminClient is a client of r with the admin token, verifying r against
// the run's CA unless in plaintext.
func (s *sim) adminClient(r *replica) *client.Client {
	return client.New(r.url, r.token, &http.Client{Transport: s.tls.clientTransport(128)})
}

// invite invites every simulated node.
func (s *sim) invite(ctx context.Context) error {
	n := s.cfg.Nodes
	s.ids, s.tokens = make([]string, n), make([]string, n)
	for i := range s.ids {
		s.ids[i] = fmt.Sprintf("sim-%06d", i)
	}
	s.rec = newRecorder(s.cfg.Lease, s.ids)
	if err := parallel(ctx, 16, n, func(i int) error {
		inv, err := s.admin.InviteNode(ctx, s.ids[i], 0)
		s.tokens[i] = inv.Token
		return err
	}); err != nil {
		return fmt.Errorf("invite the simulated nodes: %w", err)
	}
	s.progress("%d nodes invited", n)
	return nil
}

// startAgents starts the simulated agents, in this process or in
// cfg.AgentProcesses child processes, and starts the profile of the fleet
// coming up. stopAgents stops them, whether this returned an error or not.
func (s *sim) startAgents(ctx context.Context) error {
	cfg := &s.cfg
	spec := fleetSpec{Replicas: addrsOf(s.replicas), IDs: s.ids, Tokens: s.tokens, Dir: filepath.Join(s.dir, "agents"),
		Heartbeat: cfg.Heartbeat, ObserveEvery: cfg.ObserveEvery, StartTime: cfg.StartTime, RunTime: cfg.RunTime,
		NodeCPUs: cfg.NodeCPUs, NodeMemory: cfg.NodeMemory, NoFsync: cfg.NoFsync, HTTP2: cfg.HTTP2,
		EnrollConcurrency: cfg.EnrollConcurrency}
	if s.tls != nil {
		spec.CAFile = s.tls.caFile
	}
	s.agentLog = newCountingHandler(slog.LevelWarn)
	agentCtx, stop := context.WithCancel(ctx)
	s.stopAgentsC = stop
	s.agentsDone = make(chan struct{})
	s.upProfiling = cfg.CPUProfile != "" && pprof.StartCPUProfile(&s.upProfile) == nil
	s.upConns0, s.upCPU0 = s.connCounts(), cputime.Self()
	s.enrollStart = time.Now()
	if cfg.AgentProcesses == 0 {
		pprof.Do(agentCtx, pprof.Labels("component", "agents"), func(actx context.Context) {
			go func() {
				defer close(s.agentsDone)
				s.agentsErr = runAgents(actx, spec, s.rec, s.agentLog)
			}()
		})
		return nil
	}
	close(s.agentsDone)
	per := (cfg.Nodes + cfg.AgentProcesses - 1) / cfg.AgentProcesses
	for first := 0; first < cfg.Nodes; first += per {
		last := min(first+per, cfg.Nodes)
		sub := spec
		sub.First, sub.IDs, sub.Tokens = first, s.ids[first:last], s.tokens[first:last]
		sub.EnrollConcurrency = max(1, cfg.EnrollConcurrency/cfg.AgentProcesses)
		if cfg.CPUProfile != "" {
			sub.CPUProfile = fmt.Sprintf("%s.agents.%d", cfg.CPUProfile, len(s.shards))
		}
		p, err := startShard(cfg.ShardCommand, sub, s.rec, cfg.Progress)
		if err != nil {
			return err
		}
		s.shards = append(s.shards, p)
	}
	s.progress("%d agent processes started", len(s.shards))
	return nil
}

// stopAgents stops the agents startAgents started, if any.
func (s *sim) stopAgents() {
	if s.agentsDone == nil {
		return
	}
	s.stopAgentsC()
	<-s.agentsDone
	for _, p := range s.shards {
		p.stop(time.Minute)
	}
}

// waitUp waits until every node has enrolled and opened a session, or
// fails after a timeout that grows with the fleet.
func (s *sim) waitUp(ctx context.Context) error {
	rec, nodes, enrollStart := s.rec, s.cfg.Nodes, s.enrollStart
	upTimeout := 2*time.Minute + time.Duration(nodes)*20*time.Millisecond
	lastUp := time.Now()
	for rec.sessionsOpen.Load() < int64(nodes) {
		if time.Since(enrollStart) > upTimeout {
			return fmt.Errorf("after %s only %d of %d nodes enrolled and %d opened a session (agents stopped: %d %v; %v)",
				upTimeout, rec.enrolledN.Load(), nodes, rec.sessionsOpen.Load(), rec.stopped.Load(), rec.stops, s.agentsErr)
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
		if time.Since(lastUp) >= 10*time.Second {
			lastUp = time.Now()
			s.progress("%d nodes enrolled, %d in session", rec.enrolledN.Load(), rec.sessionsOpen.Load())
		}
	}
	s.fleetUp = time.Since(enrollStart)
	rec.mu.Lock()
	s.enrollSpan = rec.lastEnr.Sub(enrollStart)
	rec.mu.Unlock()
	s.progress("%d nodes enrolled in %.1fs, all in session after %.1fs", nodes, s.enrollSpan.Seconds(), s.fleetUp.Seconds())
	return nil
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func addrsOf(rs []*replica) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.addr
	}
	return out
}

// submitRuns submits cfg.Runs runs with cfg.Submitters concurrent clients,
// at cfg.RunRate a second when set, spreading them over clients: each
// submitter takes the next cfg.SubmitBatch runs (one POST /v1/runs when
// that is 1, else one POST /v1/runs/batch) until none are left. A call that
// fails for lack of a control plane is retried on the next client, under
// the call's idempotency key: a call whose replica committed it and died
// before answering (a replica kill) creates its runs once. Any other
// failure counts each of its runs as failed.
func submitRuns(ctx context.Context, cfg Config, clients []*client.Client, spec api.RunSpec, rec *recorder, submitted, failed *atomic.Int64) {
	batch := max(1, cfg.SubmitBatch)
	calls := (cfg.Runs + batch - 1) / batch
	// submit makes call k, of n runs, on c and returns their IDs.
	submit := func(c *client.Client, k, n int, key client.SubmitOption) ([]string, error) {
		sp := forCall(cfg, spec, k)
		if batch == 1 {
			run, err := c.SubmitRun(ctx, sp, key)
			return []string{run.ID}, err
		}
		specs := make([]api.RunSpec, n)
		for i := range specs {
			specs[i] = sp
		}
		runs, err := c.SubmitRuns(ctx, specs, key)
		ids := make([]string, len(runs))
		for i, r := range runs {
			ids[i] = r.ID
		}
		return ids, err
	}
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range cfg.Submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				k := int(next.Add(1) - 1)
				if k >= calls {
					return
				}
				first := k * batch
				n := min(batch, cfg.Runs-first)
				if cfg.RunRate > 0 {
					due := start.Add(time.Duration(float64(first) / cfg.RunRate * float64(time.Second)))
					if d := time.Until(due); d > 0 && !sleep(ctx, d) {
						return
					}
				}
				t0 := time.Now()
				var ids []string
				var err error
				key := client.IdempotencyKey(client.NewIdempotencyKey())
				for try := range 3 * len(clients) {
					ids, err = submit(clients[(k+try)%len(clients)], k, n, key)
					if err == nil || !errors.Is(err, failure.ErrUnavailable) {
						break
					}
					sleep(ctx, 100*time.Millisecond)
				}
				if err != nil {
					failed.Add(int64(n))
					continue
				}
				for _, id := range ids {
					rec.submitted(id, t0)
				}
				submitted.Add(int64(len(ids)))
			}
		}()
	}
	wg.Wait()
}

// parallel calls fn(i) for i in [0, n) on workers goroutines and returns
// the first error.
func parallel(ctx context.Context, workers, n int, fn func(i int) error) error {
	var next atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
