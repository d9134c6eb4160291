package fleetsim

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/fleetsim/internal/phaseprofile"
	"github.com/mercator/mercator/internal/cputime"
)

// appliedSeries counts the node events the control plane applied.
const appliedSeries = `mercator_node_events_total{outcome="applied"}`

// holdState is what the hold measured: the counters read at its start and
// end, the submissions, the replica kill and the peaks sampled during it.
type holdState struct {
	start, end time.Time
	length     time.Duration

	profile phaseprofile.Profile // this process's CPU profile of the hold, in phases: "", takeover or storm, after

	cpu0, cpu1           time.Duration // this process's CPU time
	shardCPU0, shardCPU1 time.Duration // the agent processes' CPU time
	busy0, busy1         time.Duration // the machine's busy time
	hb0                  int64         // heartbeats before the hold
	conns0, conns1       connCounts    // the replicas' connection counts
	events0              float64       // node events applied before the hold

	submitted, submitErrors, submitEnd atomic.Int64
	submitDone                         chan struct{}

	storm    *stormState
	upgrade  *upgradeState // upgrade.go; nil without Config.UpgradeAt
	kill     *KillReport
	killAt   time.Time
	takeover *takeover       // after the leader was killed (leaderkill.go)
	onKilled map[string]bool // nodes in session on the killed replica

	rssPeak, shardRSSPeak int64
	heapPeak              uint64
}

// hold keeps the fleet up for cfg.Duration, submitting runs and killing a
// replica when configured, and then for up to cfg.RunsTimeout more until
// every submitted run is running. It samples memory and scrapes the
// replicas' metrics every 5 seconds.
func (s *sim) hold(ctx context.Context) (*holdState, error) {
	if s.cfg.Projects > 0 {
		if err := s.createProjects(ctx, s.adminClient(s.survivors[0])); err != nil {
			return nil, err
		}
	}
	h := s.beginHold(ctx)
	killTimer, stormTimer := make(<-chan time.Time), make(<-chan time.Time)
	if s.cfg.KillReplicaAt > 0 {
		killTimer = time.After(s.cfg.KillReplicaAt)
	}
	if s.cfg.StormAt > 0 {
		stormTimer = time.After(s.cfg.StormAt)
	}
	upgradeTimer := make(<-chan time.Time)
	if s.cfg.UpgradeAt > 0 {
		upgradeTimer = time.After(s.cfg.UpgradeAt)
	}
	// upgradeTick follows the rollout each second until it ends.
	var upgradeTick <-chan time.Time
	// stormTick watches the storm's window, often enough to close it close
	// to the last node's return; nil outside it.
	var stormTick <-chan time.Time
	// takeoverTick follows the survivors after the leader was killed, until
	// one led and placed; nil otherwise.
	var takeoverTick <-chan time.Time
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	lastProgress := time.Now()
	for !s.holdOver(h) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-killTimer:
			s.scrapeAll(ctx) // the victim's placements up to its death
			victimPlacements := s.replicas[s.victim].metric(placementsSeries)
			if s.cfg.KillLeader {
				h.profile.Begin("takeover") // until a survivor led and placed
			}
			s.killReplica(h)
			if s.cfg.KillLeader {
				s.startTakeover(ctx, h, victimPlacements)
				t := time.NewTicker(100 * time.Millisecond)
				defer t.Stop()
				takeoverTick = t.C
			}
		case <-takeoverTick:
			if s.followTakeover(ctx, h) {
				takeoverTick = nil
				h.profile.Begin("after")
			}
		case <-stormTimer:
			h.profile.Begin("storm")
			s.startStorm(h)
			t := time.NewTicker(20 * time.Millisecond)
			defer t.Stop()
			stormTick = t.C
		case <-stormTick:
			if s.stormOver(h) {
				stormTick = nil
				h.profile.Begin("after")
			}
		case <-upgradeTimer:
			u, err := s.startUpgrade(ctx, s.adminClient(s.survivors[0]))
			if err != nil {
				return nil, err
			}
			h.upgrade = u
			s.progress("rollout of %s to %d nodes started, %d at a time", upgradeVersion, u.report.Nodes, u.report.MaxParallel)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			upgradeTick = t.C
		case <-upgradeTick:
			h.upgrade.follow(ctx, s.adminClient(s.survivors[0]), int64(s.sum(lapsesMetric)))
			if h.upgrade.done {
				upgradeTick = nil
				s.progress("%s", h.upgrade.report.String())
			}
		case <-tick.C:
			s.sample(h)
			s.scrapeAll(ctx)
			if time.Since(lastProgress) >= 10*time.Second {
				lastProgress = time.Now()
				s.progress("hold %.0fs: %d heartbeats, %d commands (%d redelivered), %d/%d runs submitted, %d running, lease lapses %.0f",
					time.Since(h.start).Seconds(), s.rec.heartbeats.Load()-h.hb0, s.rec.commands.Load(), s.rec.redeliveries.Load(),
					h.submitted.Load(), s.cfg.Runs, s.rec.runningCount(), s.sum("mercator_node_lease_lapses_total"))
			}
		}
	}
	s.endHold(ctx, h)
	return h, nil
}

// beginHold ends the profile of the fleet coming up, starts the hold's,
// reads the counters the report compares against, and starts submitting.
func (s *sim) beginHold(ctx context.Context) *holdState {
	h := &holdState{onKilled: map[string]bool{}, submitDone: make(chan struct{})}
	s.scrapeAll(ctx)
	h.events0 = s.sum(appliedSeries)
	if s.upProfiling {
		pprof.StopCPUProfile()
		if err := os.WriteFile(s.cfg.CPUProfile+".up", s.upProfile.Bytes(), 0o644); err != nil {
			s.progress("write the CPU profile: %v", err)
		}
	}
	h.profile.Begin("")
	h.start = time.Now()
	s.rec.holdStart.Store(h.start.UnixNano())
	h.cpu0 = cputime.Self()
	h.shardCPU0 = s.shardCPU()
	h.busy0 = cputime.Machine()
	h.hb0 = s.rec.heartbeats.Load()
	h.conns0 = s.connCounts()
	s.upConns, s.upCPU = h.conns0.sub(s.upConns0), h.cpu0-s.upCPU0
	if s.cfg.Runs == 0 {
		close(h.submitDone)
		return h
	}
	clients := make([]*client.Client, len(s.survivors))
	for i, r := range s.survivors {
		clients[i] = s.adminClient(r)
	}
	spec := api.RunSpec{Image: s.image, Command: []string{"/simulated"}, CPU: s.cfg.RunCPU, MemoryBytes: s.cfg.RunMemory}
	pprof.Do(ctx, pprof.Labels("component", "submitter"), func(ctx context.Context) {
		go func() {
			defer close(h.submitDone)
			submitRuns(ctx, s.cfg, clients, spec, s.rec, &h.submitted, &h.submitErrors)
			h.submitEnd.Store(time.Now().UnixNano())
		}()
	})
	return h
}

// holdOver reports whether the hold is over: cfg.Duration has passed and
// either every submitted run is running or cfg.RunsTimeout more has passed.
func (s *sim) holdOver(h *holdState) bool {
	elapsed := time.Since(h.start)
	if elapsed < s.cfg.Duration {
		return false
	}
	if elapsed >= s.cfg.Duration+s.cfg.RunsTimeout {
		return true
	}
	if s.cfg.UpgradeAt > 0 && (h.upgrade == nil || !h.upgrade.done) {
		return false // the rollout's end is part of what is measured
	}
	select {
	case <-h.submitDone:
		return s.rec.runningCount() >= int(h.submitted.Load())
	default:
		return false
	}
}

// killReplica kills the victim (replica 0, or the leader with
// Config.KillLeader), noting which nodes were in session on it.
func (s *sim) killReplica(h *holdState) {
	r := s.replicas[s.victim]
	for _, n := range s.rec.nodes {
		n.mu.Lock()
		if n.sessionReplica == r.idx {
			h.onKilled[n.id] = true
		}
		n.mu.Unlock()
	}
	h.killAt = time.Now()
	r.kill()
	h.kill = &KillReport{At: h.killAt.Sub(h.start).Seconds(), Moved: len(h.onKilled)}
	s.progress("killed replica %d with %d nodes in session on it (in %v)", s.victim, len(h.onKilled), time.Since(h.killAt).Round(time.Millisecond))
}

// endHold reads the counters at the end of the hold, ends its profile and
// writes the heap profile when asked.
func (s *sim) endHold(ctx context.Context, h *holdState) {
	h.end = time.Now()
	h.cpu1 = cputime.Self()
	h.shardCPU1 = s.shardCPU()
	h.busy1 = cputime.Machine()
	h.conns1 = s.connCounts()
	h.length = h.end.Sub(h.start)
	h.profile.End()
	if s.cfg.CPUProfile != "" {
		if err := h.profile.Write(s.cfg.CPUProfile); err != nil {
			s.progress("write the CPU profile: %v", err)
		}
	}
	s.sample(h)
	s.scrapeAll(ctx)
	if s.cfg.HeapProfile != "" {
		if f, err := os.Create(s.cfg.HeapProfile); err == nil {
			pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
		}
	}
}

// sample raises the memory peaks to what is in use now.
func (s *sim) sample(h *holdState) {
	h.rssPeak = max(h.rssPeak, procStatus("VmRSS"))
	var shardRSS int64
	for _, p := range s.shards {
		now, _ := p.rss()
		shardRSS += now
	}
	h.shardRSSPeak = max(h.shardRSSPeak, shardRSS)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	h.heapPeak = max(h.heapPeak, ms.HeapInuse)
}

// shardCPU is the CPU time the agent processes have used.
func (s *sim) shardCPU() time.Duration {
	var d time.Duration
	for _, p := range s.shards {
		d += p.cpu()
	}
	return d
}

// scrapeAll scrapes the metrics of every replica still alive.
func (s *sim) scrapeAll(ctx context.Context) {
	for _, r := range s.replicas {
		if r.killed.Load() {
			continue
		}
		m, err := scrape(ctx, s.metricsClient, r.url+"/metrics", r.token)
		if err == nil {
			r.mu.Lock()
			r.metrics = m
			r.mu.Unlock()
		}
	}
}

// sum adds a series over the replicas' last scrapes.
func (s *sim) sum(series string) float64 { return s.sumOf(s.replicas, series) }
