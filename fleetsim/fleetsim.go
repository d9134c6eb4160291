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
// several replicas); submissions go through the public API and are pinned
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
// A process holds only so many open files (in the sandbox these figures
// were measured in, 20,000, a hard limit no process may raise), and every
// agent holds its state file and a connection whose other end the control
// plane holds. So the agents can run in child processes (Config.
// AgentProcesses, shard.go), which also leaves the control plane alone in
// the parent, its CPU and memory its own; and they can speak plaintext
// HTTP/2 (Config.HTTP2), multiplexing their streams over a few
// connections, which the report labels.
//
// Run is what `mercator bench fleet` (package cli) and this package's test
// call. Nothing in a production path imports fleetsim.
package fleetsim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/cputime"
	"github.com/mercator/mercator/internal/registrytest"
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
	// directory, or a postgres:// URL (whose schema must be empty or hold
	// only an earlier simulation's tables).
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
	// HTTP2 makes the agents speak plaintext HTTP/2 (prior knowledge),
	// multiplexing their streams over a few connections per agent
	// process, instead of one HTTP/1.1 connection each: how a fleet
	// larger than the open-file limit allows still fits. Labelled in the
	// report.
	HTTP2 bool
	// Dir is the working directory (default: a temporary one, removed at
	// the end).
	Dir string
	// Progress, when set, receives a line now and then.
	Progress io.Writer
	// CPUProfile, when set, is a file to write the hold's CPU profile to
	// (goroutines labelled component=controlplane|agents|submitter|registry);
	// each agent process writes its own, over its whole life, to
	// CPUProfile+".agents.N".
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
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Submitters == 0 {
		c.Submitters = 32
	}
	if c.RunCPU == 0 {
		c.RunCPU = 0.5
	}
	if c.RunMemory == 0 {
		c.RunMemory = 256 << 20
	}
	if c.NodeCPUs == 0 {
		c.NodeCPUs = 64
	}
	if c.NodeMemory == 0 {
		c.NodeMemory = 256 << 30
	}
	if c.EnrollConcurrency == 0 {
		c.EnrollConcurrency = 200
	}
	postgres := strings.HasPrefix(c.DB, "postgres://") || strings.HasPrefix(c.DB, "postgresql://")
	switch {
	case c.Replicas > 1 && !postgres:
		return failure.Invalid("replicas", "several replicas need a shared PostgreSQL store (--db postgres://…)")
	case c.KillReplicaAt > 0 && c.Replicas < 2:
		return failure.Invalid("kill-replica-at", "killing a replica needs at least two")
	case c.AgentProcesses > 0 && len(c.ShardCommand) == 0:
		return failure.Invalid("agent-processes", "agent processes need a command that runs a shard")
	case c.Heartbeat >= c.Lease:
		return failure.Invalid("heartbeat", "the heartbeat (%s) must be shorter than the lease (%s)", c.Heartbeat, c.Lease)
	case c.SubmitBatch < 0 || c.SubmitBatch > api.MaxRunBatch:
		return failure.Invalid("submit-batch", "runs a submission call carries must be from 0 (one) to %d, not %d", api.MaxRunBatch, c.SubmitBatch)
	}
	c.SubmitBatch = max(1, c.SubmitBatch)
	return nil
}

// Report is what a simulation measured. Durations are in milliseconds
// (_ms) or seconds (_s); rates are per second of the hold unless named
// otherwise.
type Report struct {
	Nodes      int     `json:"nodes"`
	Replicas   int     `json:"replicas"`
	Store      string  `json:"store"`
	CPUs       int     `json:"cpus"`
	Machine    string  `json:"machine"`
	StateFsync bool    `json:"agent_state_fsync"`
	Heartbeat  float64 `json:"heartbeat_s"`
	Lease      float64 `json:"lease_s"`
	Hold       float64 `json:"hold_s"`

	EnrollmentsPerS float64 `json:"enrollments_per_s"`
	FleetUp         float64 `json:"fleet_up_s"` // first enrollment → every node in session

	HeartbeatsPerS         float64 `json:"heartbeats_per_s"`
	HeartbeatsExpectedPerS float64 `json:"heartbeats_expected_per_s"`
	HeartbeatErrors        int64   `json:"heartbeat_errors"`
	HeartbeatGapMaxMS      float64 `json:"heartbeat_gap_max_ms"`
	// MissedLeases is LeaseLapses plus UnreachableAtEnd.
	MissedLeases int `json:"missed_leases"`
	// LeaseLapses is the control plane's count of node reports that came
	// more than a lease after the node's previous one, summed over the
	// replicas (mercator_node_lease_lapses_total).
	LeaseLapses int `json:"lease_lapses"`
	// UnreachableAtEnd is how many nodes GET /v1/nodes showed not ready
	// when the hold ended.
	UnreachableAtEnd int `json:"unreachable_at_end"`
	// HeartbeatLapses is the agents' side: gaps between two successful
	// heartbeats of one node longer than the lease.
	HeartbeatLapses int64 `json:"heartbeat_lapses"`

	Commands             int64   `json:"commands"`
	Redeliveries         int64   `json:"redeliveries"`
	CommandDeliveryP50MS float64 `json:"command_delivery_p50_ms"`
	CommandDeliveryP99MS float64 `json:"command_delivery_p99_ms"`
	CommandDeliveryMaxMS float64 `json:"command_delivery_max_ms"`
	RunsSubmitted        int     `json:"runs_submitted"`
	// SubmitBatch is how many runs a submission call carried (1: each its
	// own POST /v1/runs; more: POST /v1/runs/batch).
	SubmitBatch int `json:"submit_batch"`
	// SubmitErrors is how many runs were not submitted: a failed batch
	// counts each of its runs.
	SubmitErrors         int64   `json:"submit_errors"`
	RunsRunning          int     `json:"runs_running"`
	SubmitPerS           float64 `json:"submissions_per_s"`
	SubmitToRunningP50MS float64 `json:"submit_to_running_p50_ms"`
	SubmitToRunningP99MS float64 `json:"submit_to_running_p99_ms"`
	PlacementsPerS       float64 `json:"placements_per_s"`
	RunsWindow           float64 `json:"runs_window_s"` // first submission → last run running
	EventsIngestedPerS   float64 `json:"events_ingested_per_s"`
	LaunchesDuplicated   int     `json:"launches_duplicated"`
	LaunchesMissing      int     `json:"launches_missing"`
	AgentProcesses       int     `json:"agent_processes"`
	HTTP2                bool    `json:"agents_http2"`
	// ProcessCPUCores is this process's CPU time over the hold's wall time:
	// the control plane, the simulator's bookkeeping and, without agent
	// processes, the agents.
	ProcessCPUCores float64 `json:"process_cpu_cores"`
	ShardCPUCores   float64 `json:"agent_processes_cpu_cores"`
	TotalCPUCores   float64 `json:"total_cpu_cores"`
	// OthersCPUCores is what the rest of the machine used meanwhile (other
	// processes, the kernel's own work): the simulation had the cores it
	// did not take.
	OthersCPUCores       float64     `json:"other_processes_cpu_cores"`
	ControlPlaneCPUCores float64     `json:"controlplane_cpu_cores"`
	AgentsCPUCores       float64     `json:"agents_cpu_cores"`
	UnattributedCPUCores float64     `json:"unattributed_cpu_cores"`
	HeapInuseMB          float64     `json:"heap_inuse_mb"`
	RSSMB                float64     `json:"rss_mb"`
	RSSPeakMB            float64     `json:"rss_peak_mb"`
	AgentsRSSPeakMB      float64     `json:"agent_processes_rss_peak_mb"`
	ControlPlaneWarnings int         `json:"controlplane_warnings"`
	ControlPlaneErrors   int         `json:"controlplane_errors"`
	AgentWarnings        int         `json:"agent_warnings"`
	AgentErrors          int         `json:"agent_errors"`
	AgentsStopped        int64       `json:"agents_stopped"`
	Kill                 *KillReport `json:"replica_kill,omitempty"`
	Notes                []string    `json:"notes"`
	LogSamples           []string    `json:"log_samples,omitempty"`
}

// KillReport is what happened when a replica was killed.
type KillReport struct {
	At float64 `json:"at_s"` // into the hold
	// Moved is how many nodes had their session on the killed replica.
	Moved int `json:"nodes_moved"`
	// NotBack is how many of those had no new session by the end.
	NotBack        int     `json:"nodes_not_back"`
	ReconnectP50MS float64 `json:"reconnect_p50_ms"`
	ReconnectP99MS float64 `json:"reconnect_p99_ms"`
	ReconnectMaxMS float64 `json:"reconnect_max_ms"`
	// OnKilled is how many nodes still had their latest session on the
	// killed replica at the end (must be 0).
	OnKilled int `json:"sessions_on_killed_replica"`
}

// Run runs one simulation and reports what it measured. It returns an
// error when the simulation could not be carried out (a replica did not
// start, nodes could not be invited); what went wrong during the hold
// (missed leases, runs that never ran) is in the Report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	if cfg.Progress != nil {
		// The shards' stderr is copied here too, each from its own
		// goroutine.
		cfg.Progress = &lockedWriter{w: cfg.Progress}
	}
	progress := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "[%7.1fs] "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
		}
	}
	// Descriptors this process needs: the control plane's end of every
	// agent connection (one each over HTTP/1.1) and, when the agents run
	// here, their state files and their ends of the connections.
	conns := uint64(cfg.Nodes) + uint64(cfg.Nodes)/5
	if cfg.HTTP2 {
		conns = 256
	}
	need := conns + 1024
	if cfg.AgentProcesses == 0 {
		need += uint64(cfg.Nodes) + conns
	}
	if got, err := raiseOpenFileLimit(need); got < need {
		return nil, fmt.Errorf("the open-file limit is %d and %d nodes need about %d in this process (each agent holds a state file and, over HTTP/1.1, a connection whose other end the control plane holds): use more agent processes or HTTP/2 (%v)", got, cfg.Nodes, need, err)
	}
	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "fleetsim-")
		if err != nil {
			return nil, err
		}
		dir = d
		defer os.RemoveAll(dir)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// The registry the control plane pins the runs' image against.
	var regHost string
	var regClose func() error
	var err error
	pprof.Do(ctx, pprof.Labels("component", "registry"), func(ctx context.Context) {
		regHost, regClose, err = registrytest.Serve(ctx, "127.0.0.1:0", "")
	})
	if err != nil {
		return nil, err
	}
	defer regClose()
	image, err := pushImage(ctx, regHost)
	if err != nil {
		return nil, err
	}

	// The control plane.
	cpLog := newCountingHandler(slog.LevelWarn)
	replicas := make([]*replica, 0, cfg.Replicas)
	defer func() {
		for _, r := range replicas {
			r.stop(10 * time.Second)
		}
	}()
	for i := range cfg.Replicas {
		r, err := startReplica(ctx, &cfg, dir, i, slog.New(cpLog))
		if err != nil {
			return nil, err
		}
		replicas = append(replicas, r)
	}
	progress("%d control-plane replica(s) up", len(replicas))
	admin := func(r *replica) *client.Client {
		return client.New(r.url, r.token, &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}})
	}
	survivors := replicas
	if cfg.KillReplicaAt > 0 {
		survivors = replicas[1:]
	}
	adminClient := admin(survivors[0])

	// Invitations.
	ids := make([]string, cfg.Nodes)
	tokens := make([]string, cfg.Nodes)
	for i := range ids {
		ids[i] = fmt.Sprintf("sim-%06d", i)
	}
	rec := newRecorder(cfg.Lease, ids)
	if err := parallel(ctx, 16, cfg.Nodes, func(i int) error {
		inv, err := adminClient.InviteNode(ctx, ids[i], 0)
		tokens[i] = inv.Token
		return err
	}); err != nil {
		return nil, fmt.Errorf("invite the simulated nodes: %w", err)
	}
	progress("%d nodes invited", cfg.Nodes)

	// Agents.
	spec := fleetSpec{Replicas: addrsOf(replicas), IDs: ids, Tokens: tokens, Dir: filepath.Join(dir, "agents"),
		Heartbeat: cfg.Heartbeat, ObserveEvery: cfg.ObserveEvery, StartTime: cfg.StartTime, RunTime: cfg.RunTime,
		NodeCPUs: cfg.NodeCPUs, NodeMemory: cfg.NodeMemory, NoFsync: cfg.NoFsync, HTTP2: cfg.HTTP2,
		EnrollConcurrency: cfg.EnrollConcurrency}
	agentLog := newCountingHandler(slog.LevelWarn)
	agentCtx, stopAgents := context.WithCancel(ctx)
	agentsDone := make(chan struct{})
	var agentsErr error
	var shards []*shardProc
	defer func() {
		stopAgents()
		<-agentsDone
		for _, p := range shards {
			p.stop(time.Minute)
		}
	}()
	// With CPUProfile, the fleet coming up is profiled too, into
	// CPUProfile+".up".
	var upProfile bytes.Buffer
	upProfiling := cfg.CPUProfile != "" && pprof.StartCPUProfile(&upProfile) == nil
	enrollStart := time.Now()
	if cfg.AgentProcesses == 0 {
		pprof.Do(agentCtx, pprof.Labels("component", "agents"), func(actx context.Context) {
			go func() {
				defer close(agentsDone)
				agentsErr = runAgents(actx, spec, rec, agentLog)
			}()
		})
	} else {
		close(agentsDone)
		per := (cfg.Nodes + cfg.AgentProcesses - 1) / cfg.AgentProcesses
		for first := 0; first < cfg.Nodes; first += per {
			last := min(first+per, cfg.Nodes)
			sub := spec
			sub.First, sub.IDs, sub.Tokens = first, ids[first:last], tokens[first:last]
			sub.EnrollConcurrency = max(1, cfg.EnrollConcurrency/cfg.AgentProcesses)
			if cfg.CPUProfile != "" {
				sub.CPUProfile = fmt.Sprintf("%s.agents.%d", cfg.CPUProfile, len(shards))
			}
			p, err := startShard(cfg.ShardCommand, sub, rec, cfg.Progress)
			if err != nil {
				return nil, err
			}
			shards = append(shards, p)
		}
		progress("%d agent processes started", len(shards))
	}
	upTimeout := 2*time.Minute + time.Duration(cfg.Nodes)*20*time.Millisecond
	lastUp := time.Now()
	for rec.sessionsOpen.Load() < int64(cfg.Nodes) {
		if time.Since(enrollStart) > upTimeout {
			return nil, fmt.Errorf("after %s only %d of %d nodes enrolled and %d opened a session (agents stopped: %d %v; %v)",
				upTimeout, rec.enrolledN.Load(), cfg.Nodes, rec.sessionsOpen.Load(), rec.stopped.Load(), rec.stops, agentsErr)
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return nil, ctx.Err()
		}
		if time.Since(lastUp) >= 10*time.Second {
			lastUp = time.Now()
			progress("%d nodes enrolled, %d in session", rec.enrolledN.Load(), rec.sessionsOpen.Load())
		}
	}
	fleetUp := time.Since(enrollStart)
	rec.mu.Lock()
	enrollSpan := rec.lastEnr.Sub(enrollStart)
	rec.mu.Unlock()
	progress("%d nodes enrolled in %.1fs, all in session after %.1fs", cfg.Nodes, enrollSpan.Seconds(), fleetUp.Seconds())

	// The hold.
	metricsClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	scrapeAll := func() {
		for _, r := range replicas {
			if r.killed.Load() {
				continue
			}
			m, err := scrape(ctx, metricsClient, r.url+"/metrics")
			if err == nil {
				r.mu.Lock()
				r.metrics = m
				r.mu.Unlock()
			}
		}
	}
	sum := func(series string) float64 {
		total := 0.0
		for _, r := range replicas {
			r.mu.Lock()
			total += r.metrics[series]
			r.mu.Unlock()
		}
		return total
	}
	const appliedSeries = `mercator_node_events_total{outcome="applied"}`
	scrapeAll()
	events0 := sum(appliedSeries)
	if upProfiling {
		pprof.StopCPUProfile()
		if err := os.WriteFile(cfg.CPUProfile+".up", upProfile.Bytes(), 0o644); err != nil {
			progress("write the CPU profile: %v", err)
		}
	}
	var profile bytes.Buffer
	profiling := pprof.StartCPUProfile(&profile) == nil
	holdStart := time.Now()
	rec.holdStart.Store(holdStart.UnixNano())
	cpu0 := cputime.Self()
	shardCPU := func() time.Duration {
		var d time.Duration
		for _, p := range shards {
			d += p.cpu()
		}
		return d
	}
	shardCPU0 := shardCPU()
	busy0 := cputime.Machine()
	hb0 := rec.heartbeats.Load()

	var submitErrors atomic.Int64
	var submitted atomic.Int64
	var submitEnd atomic.Int64
	submitDone := make(chan struct{})
	if cfg.Runs > 0 {
		clients := make([]*client.Client, len(survivors))
		for i, r := range survivors {
			clients[i] = admin(r)
		}
		spec := api.RunSpec{Image: image, Command: []string{"/simulated"}, CPU: cfg.RunCPU, MemoryBytes: cfg.RunMemory}
		pprof.Do(ctx, pprof.Labels("component", "submitter"), func(ctx context.Context) {
			go func() {
				defer close(submitDone)
				submitRuns(ctx, cfg, clients, spec, rec, &submitted, &submitErrors)
				submitEnd.Store(time.Now().UnixNano())
			}()
		})
	} else {
		close(submitDone)
	}

	var kill *KillReport
	var killAt time.Time
	onKilled := map[string]bool{}
	killTimer := make(<-chan time.Time)
	if cfg.KillReplicaAt > 0 {
		killTimer = time.After(cfg.KillReplicaAt)
	}
	var rssPeak, shardRSSPeak int64
	var heapPeak uint64
	sample := func() {
		rssPeak = max(rssPeak, procStatus("VmRSS"))
		var shardRSS int64
		for _, p := range shards {
			now, _ := p.rss()
			shardRSS += now
		}
		shardRSSPeak = max(shardRSSPeak, shardRSS)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heapPeak = max(heapPeak, ms.HeapInuse)
	}
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	lastProgress := time.Now()
hold:
	for {
		elapsed := time.Since(holdStart)
		if elapsed >= cfg.Duration {
			select {
			case <-submitDone:
				if rec.runningCount() >= int(submitted.Load()) || elapsed >= cfg.Duration+cfg.RunsTimeout {
					break hold
				}
			default:
				if elapsed >= cfg.Duration+cfg.RunsTimeout {
					break hold
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-killTimer:
			r := replicas[0]
			for _, n := range rec.nodes {
				n.mu.Lock()
				if n.sessionReplica == r.idx {
					onKilled[n.id] = true
				}
				n.mu.Unlock()
			}
			killAt = time.Now()
			r.kill()
			kill = &KillReport{At: killAt.Sub(holdStart).Seconds(), Moved: len(onKilled)}
			progress("killed replica 0 with %d nodes in session on it", len(onKilled))
		case <-tick.C:
			sample()
			scrapeAll()
			if time.Since(lastProgress) >= 10*time.Second {
				lastProgress = time.Now()
				progress("hold %.0fs: %d heartbeats, %d commands (%d redelivered), %d/%d runs submitted, %d running, lease lapses %.0f",
					time.Since(holdStart).Seconds(), rec.heartbeats.Load()-hb0, rec.commands.Load(), rec.redeliveries.Load(),
					submitted.Load(), cfg.Runs, rec.runningCount(), sum("mercator_node_lease_lapses_total"))
			}
		}
	}
	holdEnd := time.Now()
	cpu1 := cputime.Self()
	shardCPU1 := shardCPU()
	busy1 := cputime.Machine()
	hold := holdEnd.Sub(holdStart)
	if profiling {
		pprof.StopCPUProfile()
		if cfg.CPUProfile != "" {
			if err := os.WriteFile(cfg.CPUProfile, profile.Bytes(), 0o644); err != nil {
				progress("write the CPU profile: %v", err)
			}
		}
	}
	sample()
	scrapeAll()
	if cfg.HeapProfile != "" {
		if f, err := os.Create(cfg.HeapProfile); err == nil {
			pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
		}
	}

	rep := &Report{
		Nodes: cfg.Nodes, Replicas: cfg.Replicas, Store: "sqlite", CPUs: runtime.NumCPU(), StateFsync: !cfg.NoFsync,
		Heartbeat: cfg.Heartbeat.Seconds(), Lease: cfg.Lease.Seconds(), Hold: hold.Seconds(),
		EnrollmentsPerS: float64(cfg.Nodes) / enrollSpan.Seconds(), FleetUp: fleetUp.Seconds(),
		HeartbeatsPerS: rec.heartbeatRate(), HeartbeatsExpectedPerS: float64(cfg.Nodes) / cfg.Heartbeat.Seconds(),
		HeartbeatErrors: rec.heartbeatErrors.Load(), HeartbeatLapses: rec.heartbeatLapses.Load(),
		Commands: rec.commands.Load(), Redeliveries: rec.redeliveries.Load(), SubmitBatch: cfg.SubmitBatch, SubmitErrors: submitErrors.Load(),
		EventsIngestedPerS: (sum(appliedSeries) - events0) / hold.Seconds(),
		LaunchesDuplicated: rec.launches.Duplicates(), AgentsStopped: rec.stopped.Load(), AgentProcesses: len(shards), HTTP2: cfg.HTTP2,
		ProcessCPUCores: (cpu1 - cpu0).Seconds() / hold.Seconds(),
		RSSPeakMB:       float64(rssPeak) / (1 << 20),
	}
	if cfg.DB != "" {
		rep.Store = "postgres"
	}
	if len(shards) == 0 {
		rep.Machine = fmt.Sprintf("%d CPU cores, shared by the control plane (%d replica(s)) and all %d simulated agents, in one process", rep.CPUs, cfg.Replicas, cfg.Nodes)
	} else {
		rep.Machine = fmt.Sprintf("%d CPU cores, shared by the control plane (%d replica(s), this process) and %d simulated agents (in %d child processes)", rep.CPUs, cfg.Replicas, cfg.Nodes, len(shards))
	}
	rep.LeaseLapses = int(sum("mercator_node_lease_lapses_total"))

	// Nodes not ready at the end, as the control plane shows them.
	if list, err := adminClient.ListNodes(ctx); err == nil {
		for _, n := range list.Nodes {
			if n.Status != api.NodeReady {
				rep.UnreachableAtEnd++
			}
		}
	} else {
		rep.Notes = append(rep.Notes, "could not list nodes at the end: "+err.Error())
		rep.UnreachableAtEnd = -1
	}
	rep.MissedLeases = rep.LeaseLapses + max(rep.UnreachableAtEnd, 0)

	// Heartbeat gaps.
	var maxGap time.Duration
	for _, n := range rec.nodes {
		n.mu.Lock()
		maxGap = max(maxGap, n.maxGap)
		n.mu.Unlock()
	}
	rep.HeartbeatGapMaxMS = ms(maxGap)

	// Commands and runs.
	rec.mu.Lock()
	delivery := append([]time.Duration(nil), rec.delivery...)
	var toRunning []time.Duration
	var firstSubmit, lastRunning time.Time
	for id, rr := range rec.runs {
		if rr.submitted.IsZero() {
			continue
		}
		rep.RunsSubmitted++
		if firstSubmit.IsZero() || rr.submitted.Before(firstSubmit) {
			firstSubmit = rr.submitted
		}
		if rec.launches.Count(capability.WorkloadKey{RunID: id, Attempt: 1}) == 0 && rr.received.IsZero() {
			rep.LaunchesMissing++
		}
		if rr.running.IsZero() {
			continue
		}
		rep.RunsRunning++
		toRunning = append(toRunning, rr.running.Sub(rr.submitted))
		if rr.running.After(lastRunning) {
			lastRunning = rr.running
		}
	}
	rec.mu.Unlock()
	sortDurations(delivery)
	sortDurations(toRunning)
	rep.CommandDeliveryP50MS, rep.CommandDeliveryP99MS = ms(percentile(delivery, 0.5)), ms(percentile(delivery, 0.99))
	if len(delivery) > 0 {
		rep.CommandDeliveryMaxMS = ms(delivery[len(delivery)-1])
	}
	rep.SubmitToRunningP50MS, rep.SubmitToRunningP99MS = ms(percentile(toRunning, 0.5)), ms(percentile(toRunning, 0.99))
	if rep.RunsSubmitted > 0 {
		if end := submitEnd.Load(); end > 0 {
			rep.SubmitPerS = float64(rep.RunsSubmitted) / time.Unix(0, end).Sub(firstSubmit).Seconds()
		}
		if rep.RunsRunning > 0 {
			window := lastRunning.Sub(firstSubmit)
			rep.RunsWindow = window.Seconds()
			rep.PlacementsPerS = float64(rep.RunsRunning) / window.Seconds()
		}
	}

	// The replica kill.
	if kill != nil {
		var back []time.Duration
		for id := range onKilled {
			n := rec.nodes[rec.byID[id]]
			n.mu.Lock()
			if n.sessionAt.After(killAt) {
				back = append(back, n.sessionAt.Sub(killAt))
			} else {
				kill.NotBack++
			}
			n.mu.Unlock()
		}
		for _, n := range rec.nodes {
			n.mu.Lock()
			if n.sessionReplica == 0 {
				kill.OnKilled++
			}
			n.mu.Unlock()
		}
		sortDurations(back)
		kill.ReconnectP50MS, kill.ReconnectP99MS = ms(percentile(back, 0.5)), ms(percentile(back, 0.99))
		if len(back) > 0 {
			kill.ReconnectMaxMS = ms(back[len(back)-1])
		}
		rep.Kill = kill
	}

	// CPU split and memory.
	rep.ShardCPUCores = (shardCPU1 - shardCPU0).Seconds() / hold.Seconds()
	rep.TotalCPUCores = rep.ProcessCPUCores + rep.ShardCPUCores
	rep.OthersCPUCores = max(0, (busy1-busy0).Seconds()/hold.Seconds()-rep.TotalCPUCores)
	if profiling {
		if split, err := cpuByLabel(profile.Bytes(), "component"); err == nil {
			var total time.Duration
			for _, d := range split {
				total += d
			}
			if total > 0 {
				share := func(d time.Duration) float64 { return rep.ProcessCPUCores * float64(d) / float64(total) }
				rep.ControlPlaneCPUCores = share(split["controlplane"])
				rep.AgentsCPUCores = share(split["agents"]) + rep.ShardCPUCores
				rep.UnattributedCPUCores = share(split[""])
			}
		} else {
			rep.Notes = append(rep.Notes, "CPU split unavailable: "+err.Error())
		}
	} else {
		rep.Notes = append(rep.Notes, "CPU split unavailable: a CPU profile was already running")
	}
	var msNow runtime.MemStats
	runtime.ReadMemStats(&msNow)
	rep.HeapInuseMB = float64(max(heapPeak, msNow.HeapInuse)) / (1 << 20)
	rep.RSSMB = float64(procStatus("VmRSS")) / (1 << 20)
	rep.RSSPeakMB = float64(max(rssPeak, procStatus("VmHWM"))) / (1 << 20)
	rep.AgentsRSSPeakMB = float64(shardRSSPeak) / (1 << 20)

	var samples []string
	rep.ControlPlaneWarnings, rep.ControlPlaneErrors, samples = cpLog.counts()
	rep.LogSamples = append(rep.LogSamples, prefixAll("controlplane: ", samples)...)
	rep.AgentWarnings, rep.AgentErrors, samples = agentLog.counts()
	rep.LogSamples = append(rep.LogSamples, prefixAll("agent: ", samples)...)
	for _, p := range shards {
		p.stop(time.Minute)
		rep.AgentWarnings += p.end.Warn
		rep.AgentErrors += p.end.Errs
		rep.LogSamples = append(rep.LogSamples, prefixAll("agent: ", p.end.Logs)...)
		if p.end.Err != "" {
			rep.Notes = append(rep.Notes, "an agent process ended with: "+p.end.Err)
		}
	}
	rec.mu.Lock()
	rep.LogSamples = append(rep.LogSamples, prefixAll("agent stopped: ", rec.stops)...)
	rec.mu.Unlock()

	rep.Notes = append(rep.Notes,
		fmt.Sprintf("a simulated launch takes %s and its container then %s", cfg.StartTime, runTimeNote(cfg.RunTime)),
		fmt.Sprintf("agents observe every %s and on every simulated start and exit", cfg.ObserveEvery),
		memoryNote(len(shards)))
	if cfg.HTTP2 {
		rep.Notes = append(rep.Notes, "agents speak plaintext HTTP/2 with prior knowledge, streams multiplexed over a few connections per agent process, instead of one HTTP/1.1 connection per agent")
	}
	if cfg.NoFsync {
		rep.Notes = append(rep.Notes, "AGENT STATE WITHOUT FSYNC: the simulated agents' bbolt files skip fsync (nodeagent.WithoutFsync); real agents fsync every write")
	}
	if cfg.Runs > 0 && cfg.SubmitBatch > 1 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("runs were submitted %d to a call (POST /v1/runs/batch); a run's submission time is its call's start, so submission → running includes admitting and storing its whole batch", cfg.SubmitBatch))
	}
	if cfg.Runs > 0 && rep.RunsRunning < rep.RunsSubmitted {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d of %d runs were not running when the hold ended", rep.RunsSubmitted-rep.RunsRunning, rep.RunsSubmitted))
	}
	progress("hold done after %.1fs", hold.Seconds())
	return rep, nil
}

func memoryNote(shards int) string {
	if shards == 0 {
		return "memory figures are the whole process: control plane and simulated agents together"
	}
	return "memory figures are the control plane's process (with the simulator's bookkeeping); the agents' processes are counted apart"
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

func runTimeNote(d time.Duration) string {
	if d == 0 {
		return "runs until the simulation ends"
	}
	return "runs " + d.String()
}

func prefixAll(p string, s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = p + v
	}
	return out
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
// fails for lack of a control plane is retried on the next client; any
// other failure counts each of its runs as failed.
func submitRuns(ctx context.Context, cfg Config, clients []*client.Client, spec api.RunSpec, rec *recorder, submitted, failed *atomic.Int64) {
	batch := max(1, cfg.SubmitBatch)
	calls := (cfg.Runs + batch - 1) / batch
	specs := make([]api.RunSpec, batch) // read only, shared by every call
	for i := range specs {
		specs[i] = spec
	}
	// submit makes one call of n runs on c and returns their IDs.
	submit := func(c *client.Client, n int) ([]string, error) {
		if batch == 1 {
			run, err := c.SubmitRun(ctx, spec)
			return []string{run.ID}, err
		}
		runs, err := c.SubmitRuns(ctx, specs[:n])
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
				for try := range 3 * len(clients) {
					ids, err = submit(clients[(k+try)%len(clients)], n)
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

func agentsRow(r *Report) string {
	proto := "HTTP/1.1, a connection each"
	if r.HTTP2 {
		proto = "plaintext HTTP/2, multiplexed"
	}
	if r.AgentProcesses == 0 {
		return "in the control plane's process; " + proto
	}
	return fmt.Sprintf("in %d child processes; %s", r.AgentProcesses, proto)
}

// submitCallsRow says how runs were submitted, for the runs row.
func submitCallsRow(batch int) string {
	if batch <= 1 {
		return "one a call, POST /v1/runs"
	}
	return fmt.Sprintf("%d a call, POST /v1/runs/batch", batch)
}

// WriteText writes the report for a person.
func (r *Report) WriteText(w io.Writer) {
	fsync := "yes (as real agents)"
	if !r.StateFsync {
		fsync = "NO — simulation only (nodeagent.WithoutFsync)"
	}
	rows := [][2]string{
		{"machine", r.Machine},
		{"store", fmt.Sprintf("%s, %d replica(s)", r.Store, r.Replicas)},
		{"agent state fsync", fsync},
		{"agents", agentsRow(r)},
		{"heartbeat / lease", fmt.Sprintf("%gs / %gs", r.Heartbeat, r.Lease)},
		{"hold", fmt.Sprintf("%.1fs", r.Hold)},
		{"enrollments", fmt.Sprintf("%.0f/s (every node in session after %.1fs)", r.EnrollmentsPerS, r.FleetUp)},
		{"heartbeats", fmt.Sprintf("%.0f/s sustained (%.0f/s expected), %d failed, longest gap %.1fs", r.HeartbeatsPerS, r.HeartbeatsExpectedPerS, r.HeartbeatErrors, r.HeartbeatGapMaxMS/1000)},
		{"missed leases", fmt.Sprintf("%d (control plane: %d lapses, %d unreachable at the end; agents: %d gaps over the lease)", r.MissedLeases, r.LeaseLapses, r.UnreachableAtEnd, r.HeartbeatLapses)},
		{"commands", fmt.Sprintf("%d delivered, %d redelivered", r.Commands, r.Redeliveries)},
		{"command delivery", fmt.Sprintf("p50 %.1f ms, p99 %.1f ms, max %.1f ms (created on the control plane → received by the agent)", r.CommandDeliveryP50MS, r.CommandDeliveryP99MS, r.CommandDeliveryMaxMS)},
		{"runs", fmt.Sprintf("%d submitted (%.0f/s, %s, %d failed), %d running", r.RunsSubmitted, r.SubmitPerS, submitCallsRow(r.SubmitBatch), r.SubmitErrors, r.RunsRunning)},
		{"submission → running", fmt.Sprintf("p50 %.1f ms, p99 %.1f ms", r.SubmitToRunningP50MS, r.SubmitToRunningP99MS)},
		{"placements end to end", fmt.Sprintf("%.0f/s (runs running / %.1fs from the first submission to the last run running)", r.PlacementsPerS, r.RunsWindow)},
		{"launches", fmt.Sprintf("%d performed twice, %d never performed", r.LaunchesDuplicated, r.LaunchesMissing)},
		{"events ingested", fmt.Sprintf("%.0f/s", r.EventsIngestedPerS)},
		{"CPU", fmt.Sprintf("%.2f cores of %d in all: control plane %.2f, agents %.2f, this process's Go runtime/GC (unattributed) %.2f; other processes on the machine %.2f", r.TotalCPUCores, r.CPUs, r.ControlPlaneCPUCores, r.AgentsCPUCores, r.UnattributedCPUCores, r.OthersCPUCores)},
		{"memory", fmt.Sprintf("this process: heap in use %.0f MB (peak), RSS %.0f MB (peak %.0f MB); agent processes: RSS %.0f MB (peak, together)", r.HeapInuseMB, r.RSSMB, r.RSSPeakMB, r.AgentsRSSPeakMB)},
		{"logs", fmt.Sprintf("control plane %d warnings, %d errors; agents %d warnings, %d errors, %d stopped", r.ControlPlaneWarnings, r.ControlPlaneErrors, r.AgentWarnings, r.AgentErrors, r.AgentsStopped)},
	}
	if k := r.Kill; k != nil {
		rows = append(rows, [2]string{"replica killed", fmt.Sprintf("at %.1fs: %d nodes moved, reconnect p50 %.0f ms p99 %.0f ms max %.0f ms, %d not back, %d sessions left on it",
			k.At, k.Moved, k.ReconnectP50MS, k.ReconnectP99MS, k.ReconnectMaxMS, k.NotBack, k.OnKilled)})
	}
	fmt.Fprintf(w, "Fleet simulation: %d nodes\n", r.Nodes)
	for _, row := range rows {
		fmt.Fprintf(w, "  %-24s %s\n", row[0], row[1])
	}
	notes := append([]string(nil), r.Notes...)
	sort.Strings(notes)
	for _, n := range notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	for _, s := range r.LogSamples {
		fmt.Fprintf(w, "  log: %s\n", s)
	}
}
