package fleetsim

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sort"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

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
	// TLS is whether the replicas served HTTPS and the agents verified
	// them (the default); false is Config.Plaintext.
	TLS bool `json:"tls"`

	EnrollmentsPerS float64 `json:"enrollments_per_s"`
	FleetUp         float64 `json:"fleet_up_s"` // first enrollment → every node in session
	// UpConnections and UpProcessCPU are the replicas' connections and
	// this process's CPU seconds from the agents' start until every node
	// was in session.
	UpConnections Connections `json:"fleet_up_connections"`
	UpProcessCPU  float64     `json:"fleet_up_process_cpu_s"`
	// HoldConnections are the replicas' connections during the hold.
	HoldConnections Connections `json:"hold_connections"`

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
	OthersCPUCores       float64      `json:"other_processes_cpu_cores"`
	ControlPlaneCPUCores float64      `json:"controlplane_cpu_cores"`
	AgentsCPUCores       float64      `json:"agents_cpu_cores"`
	UnattributedCPUCores float64      `json:"unattributed_cpu_cores"`
	HeapInuseMB          float64      `json:"heap_inuse_mb"`
	RSSMB                float64      `json:"rss_mb"`
	RSSPeakMB            float64      `json:"rss_peak_mb"`
	AgentsRSSPeakMB      float64      `json:"agent_processes_rss_peak_mb"`
	ControlPlaneWarnings int          `json:"controlplane_warnings"`
	ControlPlaneErrors   int          `json:"controlplane_errors"`
	AgentWarnings        int          `json:"agent_warnings"`
	AgentErrors          int          `json:"agent_errors"`
	AgentsStopped        int64        `json:"agents_stopped"`
	Kill                 *KillReport  `json:"replica_kill,omitempty"`
	Storm                *StormReport `json:"reconnect_storm,omitempty"`
	// Upgrade is the fleet's rollout to a new agent release (UpgradeAt).
	Upgrade    *UpgradeReport `json:"upgrade,omitempty"`
	Notes      []string       `json:"notes"`
	LogSamples []string       `json:"log_samples,omitempty"`
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
	// With Config.KillLeader (leaderkill.go): Leader says the killed
	// replica led; the placements it made before it died and the
	// survivors' after; how long after the kill a survivor led and first
	// placed, by the survivor's own clock (its epoch's timestamps, so a
	// scrape that comes late does not stretch them), and when the
	// simulator's scrapes saw each; and the nodes holding more than their
	// capacity at the end in the runs placed on them, of RunsChecked runs
	// (must be 0; -1 when the runs could not be read).
	Leader               bool    `json:"leader,omitempty"`
	PlacementsByKilled   int64   `json:"placements_by_killed,omitempty"`
	PlacementsAfter      int64   `json:"placements_after,omitempty"`
	NewLeaderMS          float64 `json:"new_leader_ms,omitempty"`
	FirstPlacementMS     float64 `json:"first_placement_ms,omitempty"`
	NewLeaderSeenMS      float64 `json:"new_leader_seen_ms,omitempty"`
	FirstPlacementSeenMS float64 `json:"first_placement_seen_ms,omitempty"`
	OverCommitted        int     `json:"nodes_over_committed"`
	RunsChecked          int     `json:"runs_checked,omitempty"`
}

// report builds the Report from what the hold measured. It stops the
// agent processes, whose last words (log counts, samples, errors) it
// reports.
func (s *sim) report(ctx context.Context, h *holdState) *Report {
	cfg, rec, hold := &s.cfg, s.rec, h.length
	rep := &Report{
		Nodes: cfg.Nodes, Replicas: cfg.Replicas, Store: "sqlite", CPUs: runtime.NumCPU(), StateFsync: !cfg.NoFsync,
		Heartbeat: cfg.Heartbeat.Seconds(), Lease: cfg.Lease.Seconds(), Hold: hold.Seconds(), TLS: s.tls != nil,
		UpConnections: s.upConns.report(), UpProcessCPU: s.upCPU.Seconds(), HoldConnections: h.conns1.sub(h.conns0).report(),
		EnrollmentsPerS: float64(cfg.Nodes) / s.enrollSpan.Seconds(), FleetUp: s.fleetUp.Seconds(),
		HeartbeatsPerS: rec.heartbeatRate(), HeartbeatsExpectedPerS: float64(cfg.Nodes) / cfg.Heartbeat.Seconds(),
		HeartbeatErrors: rec.heartbeatErrors.Load(), HeartbeatLapses: rec.heartbeatLapses.Load(), HeartbeatGapMaxMS: ms(rec.maxHeartbeatGap()),
		Commands: rec.commands.Load(), Redeliveries: rec.redeliveries.Load(), SubmitBatch: cfg.SubmitBatch, SubmitErrors: h.submitErrors.Load(),
		EventsIngestedPerS: (s.sum(appliedSeries) - h.events0) / hold.Seconds(),
		LaunchesDuplicated: rec.launches.Duplicates(), AgentsStopped: rec.stopped.Load(), AgentProcesses: len(s.shards), HTTP2: cfg.HTTP2,
		ProcessCPUCores: (h.cpu1 - h.cpu0).Seconds() / hold.Seconds(),
		RSSPeakMB:       float64(h.rssPeak) / (1 << 20),
	}
	if cfg.postgres() {
		rep.Store = "postgres" // --db sqlite://PATH stays "sqlite"
	}
	if len(s.shards) == 0 {
		rep.Machine = fmt.Sprintf("%d CPU cores, shared by the control plane (%d replica(s)) and all %d simulated agents, in one process", rep.CPUs, cfg.Replicas, cfg.Nodes)
	} else {
		rep.Machine = fmt.Sprintf("%d CPU cores, shared by the control plane (%d replica(s), this process) and %d simulated agents (in %d child processes)", rep.CPUs, cfg.Replicas, cfg.Nodes, len(s.shards))
	}
	rep.LeaseLapses = int(s.sum("mercator_node_lease_lapses_total"))
	s.reportNodes(ctx, rep)
	s.reportRuns(rep, h)
	s.reportKill(rep, h)
	s.reportTakeover(ctx, rep, h)
	s.reportStorm(rep, h)
	if h.upgrade != nil {
		rep.Upgrade = &h.upgrade.report
	}
	s.reportResources(rep, h)
	s.reportLogs(rep)
	s.reportNotes(rep)
	return rep
}

// reportNodes reports the nodes not ready at the end, as the control plane
// shows them.
func (s *sim) reportNodes(ctx context.Context, rep *Report) {
	if list, err := s.admin.ListNodes(ctx); err == nil {
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
}

// reportRuns reports command delivery, submissions and how long runs took
// to be running.
func (s *sim) reportRuns(rep *Report, h *holdState) {
	rec := s.rec
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
		if rec.launches.Count(nodeproto.WorkloadKey{RunID: id, Attempt: 1}) == 0 && rr.received.IsZero() {
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
		if end := h.submitEnd.Load(); end > 0 {
			rep.SubmitPerS = float64(rep.RunsSubmitted) / time.Unix(0, end).Sub(firstSubmit).Seconds()
		}
		if rep.RunsRunning > 0 {
			window := lastRunning.Sub(firstSubmit)
			rep.RunsWindow = window.Seconds()
			rep.PlacementsPerS = float64(rep.RunsRunning) / window.Seconds()
		}
	}
}

// reportKill reports how the nodes of a killed replica came back.
func (s *sim) reportKill(rep *Report, h *holdState) {
	kill := h.kill
	if kill == nil {
		return
	}
	rec := s.rec
	var back []time.Duration
	for id := range h.onKilled {
		n := rec.nodes[rec.byID[id]]
		n.mu.Lock()
		if n.sessionAt.After(h.killAt) {
			back = append(back, n.sessionAt.Sub(h.killAt))
		} else {
			kill.NotBack++
		}
		n.mu.Unlock()
	}
	for _, n := range rec.nodes {
		n.mu.Lock()
		if n.sessionReplica == s.victim {
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

// reportResources reports the CPU split (from the hold's profile) and
// memory.
func (s *sim) reportResources(rep *Report, h *holdState) {
	hold := h.length
	rep.ShardCPUCores = (h.shardCPU1 - h.shardCPU0).Seconds() / hold.Seconds()
	rep.TotalCPUCores = rep.ProcessCPUCores + rep.ShardCPUCores
	rep.OthersCPUCores = max(0, (h.busy1-h.busy0).Seconds()/hold.Seconds()-rep.TotalCPUCores)
	if h.profile.Profiled() {
		if split, err := h.profile.ByLabel("component"); err == nil {
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
	rep.HeapInuseMB = float64(max(h.heapPeak, msNow.HeapInuse)) / (1 << 20)
	rep.RSSMB = float64(procStatus("VmRSS")) / (1 << 20)
	rep.RSSPeakMB = float64(max(h.rssPeak, procStatus("VmHWM"))) / (1 << 20)
	rep.AgentsRSSPeakMB = float64(h.shardRSSPeak) / (1 << 20)
}

// reportLogs counts the warnings and errors logged, with samples, and
// stops the agent processes to collect theirs.
func (s *sim) reportLogs(rep *Report) {
	var samples []string
	rep.ControlPlaneWarnings, rep.ControlPlaneErrors, samples = s.cpLog.counts()
	rep.LogSamples = append(rep.LogSamples, prefixAll("controlplane: ", samples)...)
	rep.AgentWarnings, rep.AgentErrors, samples = s.agentLog.counts()
	rep.LogSamples = append(rep.LogSamples, prefixAll("agent: ", samples)...)
	for _, p := range s.shards {
		p.stop(time.Minute)
		rep.AgentWarnings += p.end.Warn
		rep.AgentErrors += p.end.Errs
		rep.LogSamples = append(rep.LogSamples, prefixAll("agent: ", p.end.Logs)...)
		if p.end.Err != "" {
			rep.Notes = append(rep.Notes, "an agent process ended with: "+p.end.Err)
		}
	}
	s.rec.mu.Lock()
	rep.LogSamples = append(rep.LogSamples, prefixAll("agent stopped: ", s.rec.stops)...)
	s.rec.mu.Unlock()
}

// http2Note says how --http2 agents reach the replicas, which a real
// fleet does not: nodesPerConn agents share each connection.
func http2Note(tls bool) string {
	how := "plaintext HTTP/2 with prior knowledge"
	if tls {
		how = "HTTP/2 over TLS"
	}
	return fmt.Sprintf("agents share connections, %d to a connection, their streams multiplexed (%s), where each real agent holds a connection of its own", nodesPerConn, how)
}

// reportNotes says how the simulation was configured where that changes
// how its figures read.
func (s *sim) reportNotes(rep *Report) {
	cfg := &s.cfg
	rep.Notes = append(rep.Notes,
		fmt.Sprintf("a simulated launch takes %s and its container then %s", cfg.StartTime, runTimeNote(cfg.RunTime)),
		fmt.Sprintf("agents observe every %s and on every simulated start and exit", cfg.ObserveEvery),
		memoryNote(len(s.shards)))
	if cfg.Projects > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("runs submitted to %d projects in turn (quotas splitting the fleet's CPU and memory, weights 1–3, a quarter of the calls at priority 10): the scheduler plans by project", cfg.Projects))
	}
	if cfg.HTTP2 {
		rep.Notes = append(rep.Notes, http2Note(s.tls != nil))
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
}

func memoryNote(shards int) string {
	if shards == 0 {
		return "memory figures are the whole process: control plane and simulated agents together"
	}
	return "memory figures are the control plane's process (with the simulator's bookkeeping); the agents' processes are counted apart"
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

// transportRow says whether the fleet spoke TLS.
func transportRow(r *Report) string {
	if r.TLS {
		return "HTTPS: one CA made for the run, every agent verifying the replicas against it (pinned by its invitation), TLS sessions resumed"
	}
	return "PLAINTEXT HTTP on loopback (--plaintext; the product serves HTTPS)"
}

func agentsRow(r *Report) string {
	proto := "HTTP/1.1, a session connection each and a shared pool for calls"
	switch {
	case r.HTTP2:
		proto = "HTTP/2, multiplexed over a few connections per process"
	case r.TLS:
		proto = "each its own client, the real agent's: HTTP/2, one connection carrying its session and calls"
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
		{"transport", transportRow(r)},
		{"agents", agentsRow(r)},
		{"heartbeat / lease", fmt.Sprintf("%gs / %gs", r.Heartbeat, r.Lease)},
		{"hold", fmt.Sprintf("%.1fs", r.Hold)},
		{"enrollments", fmt.Sprintf("%.0f/s (every node in session after %.1fs)", r.EnrollmentsPerS, r.FleetUp)},
		{"fleet coming up", fmt.Sprintf("%s; this process %.1f CPU s", r.UpConnections, r.UpProcessCPU)},
		{"connections in hold", r.HoldConnections.String()},
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
		if k.Leader {
			rows = append(rows, [2]string{"leader killed", fmt.Sprintf("%d placements by it, %d after by the others; a new leader after %.0f ms, its first placement after %.0f ms (by its clock; its scrapes showed them after %.0f and %.0f ms); %d nodes over-committed (%d runs checked)",
				k.PlacementsByKilled, k.PlacementsAfter, k.NewLeaderMS, k.FirstPlacementMS, k.NewLeaderSeenMS, k.FirstPlacementSeenMS, k.OverCommitted, k.RunsChecked)})
		}
	}
	if u := r.Upgrade; u != nil {
		rows = append(rows, [2]string{"agent upgrade", u.String()})
	}
	if st := r.Storm; st != nil {
		rows = append(rows, [2]string{"reconnect storm", st.String()})
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
