package scheduler

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strings"
	"testing"
)

// fleetSim plays a control plane against Schedule, round by round, over a
// fleet of 8×H100 machines: it commits placements, asks preempted attempts
// to stop (they are gone the round after, and requeued in their place in
// the queue, as the control plane requeues them), finishes attempts when
// their time is up, and forgets preemption reasons after a window. It
// checks every plan as it goes.
type fleetSim struct {
	t        *testing.T
	rng      *rand.Rand
	nodes    int
	projects []Project
	pending  []simRun // in submission order
	running  []*simAttempt
	round    int
	window   int
	// edges: preemptor run → victim run, for the cycle check.
	edges map[string][]string
	// gpuRounds is GPU-rounds held by project, for the fair-share check.
	gpuRounds map[string]float64
	history   map[string]float64
	// preemptions counts them by reason kind, so a test can say it
	// exercised them.
	preemptions map[string]int
	decay       float64
	seq         int
}

type simRun struct {
	Run
	seq      int
	duration int
	// preempted: reason key → round, within the window.
	preempted map[string]int
}

type simAttempt struct {
	simRun
	node     int
	gpus     []string
	started  int
	stopping bool
}

func newFleetSim(t *testing.T, seed int64, nodes int, projects []Project) *fleetSim {
	return &fleetSim{t: t, rng: rand.New(rand.NewSource(seed)), nodes: nodes, projects: projects, window: 20,
		edges: map[string][]string{}, gpuRounds: map[string]float64{}, history: map[string]float64{}, decay: 0.9, preemptions: map[string]int{}}
}

func (f *fleetSim) submit(project string, gpus, priority, duration int) {
	f.seq++
	r := gpuRun(fmt.Sprintf("r-%06d", f.seq), project, gpus, priority)
	f.pending = append(f.pending, simRun{Run: r, seq: f.seq, duration: duration, preempted: map[string]int{}})
}

// snapshot is the fleet and queue as the control plane would pass them.
func (f *fleetSim) snapshot() Snapshot {
	s := Snapshot{Projects: slices.Clone(f.projects)}
	for i := range s.Projects {
		s.Projects[i].History = f.history[s.Projects[i].Name]
	}
	for k := range f.nodes {
		s.Nodes = append(s.Nodes, h100Node(fmt.Sprintf("n%03d", k)))
	}
	for _, a := range f.running {
		n := &s.Nodes[a.node]
		for _, g := range a.gpus {
			n.UsedGPUs[g] = true
		}
		n.UsedCPU += a.CPU
		n.UsedMemory += a.MemoryBytes
		rr := Running{RunID: a.ID, NodeID: n.ID, Project: a.Project, Priority: a.Priority, Order: int64(a.started)*1e6 + int64(a.seq),
			CPU: a.CPU, MemoryBytes: a.MemoryBytes, GPUs: a.gpus, Stopping: a.stopping}
		for key, at := range a.preempted {
			if f.round-at < f.window {
				rr.PreemptedFor = append(rr.PreemptedFor, key)
			}
		}
		s.Running = append(s.Running, rr)
	}
	for _, r := range f.pending {
		s.Pending = append(s.Pending, r.Run)
	}
	return s
}

// step plays one round and reports whether anything changed.
func (f *fleetSim) step() bool {
	f.round++
	changed := false
	// Stopped attempts leave and are requeued in submission order.
	kept := f.running[:0]
	for _, a := range f.running {
		if a.stopping {
			f.pending = append(f.pending, a.simRun)
			changed = true
			continue
		}
		kept = append(kept, a)
	}
	f.running = kept
	slices.SortFunc(f.pending, func(a, b simRun) int { return a.seq - b.seq })

	s := f.snapshot()
	plan := Schedule(s)
	f.check(s, plan)
	byID := map[string]*simAttempt{}
	for _, a := range f.running {
		byID[a.ID] = a
	}
	for _, p := range plan.Preemptions {
		a := byID[p.RunID]
		a.stopping = true
		a.preempted[p.Key] = f.round
		f.edges[p.By] = append(f.edges[p.By], p.RunID)
		kind, _, _ := strings.Cut(p.Key, ":")
		f.preemptions[kind]++
		changed = true
	}
	placed := map[string]Placement{}
	for _, p := range plan.Placements {
		placed[p.RunID] = p
	}
	left := f.pending[:0]
	for _, r := range f.pending {
		p, ok := placed[r.ID]
		if !ok {
			left = append(left, r)
			continue
		}
		ni := slices.IndexFunc(s.Nodes, func(n Node) bool { return n.ID == p.NodeID })
		f.running = append(f.running, &simAttempt{simRun: r, node: ni, gpus: p.GPUs, started: f.round})
		changed = true
	}
	f.pending = left
	f.account()
	return changed
}

// finish ends the attempts whose time is up.
func (f *fleetSim) finish() {
	kept := f.running[:0]
	for _, a := range f.running {
		if !a.stopping && f.round-a.started >= a.duration {
			continue
		}
		kept = append(kept, a)
	}
	f.running = kept
}

// account adds this round's GPU use to each project's total and decayed
// history (dominant share: GPUs are the only scarce resource here).
func (f *fleetSim) account() {
	use := map[string]float64{}
	for _, a := range f.running {
		use[a.Project] += float64(len(a.gpus))
	}
	capacity := float64(8 * f.nodes)
	for _, p := range f.projects {
		f.gpuRounds[p.Name] += use[p.Name]
		f.history[p.Name] = f.history[p.Name]*f.decay + (1-f.decay)*use[p.Name]/capacity
	}
}

// check holds one plan to the promises: no GPU to two attempts, every
// preemption allowed by policy and not repeated for its reason within the
// window.
func (f *fleetSim) check(s Snapshot, plan Plan) {
	f.t.Helper()
	held := map[string]string{}
	for _, r := range s.Running {
		for _, g := range r.GPUs {
			held[g] = r.RunID
		}
	}
	for _, p := range plan.Placements {
		for _, g := range p.GPUs {
			if other, ok := held[g]; ok {
				f.t.Fatalf("round %d: GPU %s given to %s while %s holds it", f.round, g, p.RunID, other)
			}
			held[g] = p.RunID
		}
	}
	used := map[string]float64{}
	for _, r := range s.Running {
		used[r.Project] += float64(len(r.GPUs))
	}
	quota := map[string]float64{}
	for _, p := range f.projects {
		quota[p.Name] = float64(p.GPUs["H100"])
	}
	pendingByID := map[string]Run{}
	for _, r := range s.Pending {
		pendingByID[r.ID] = r
	}
	taken := map[string]float64{}
	for _, p := range plan.Preemptions {
		victim := s.Running[slices.IndexFunc(s.Running, func(r Running) bool { return r.RunID == p.RunID })]
		by := pendingByID[p.By]
		if victim.Stopping || slices.Contains(victim.PreemptedFor, p.Key) {
			f.t.Fatalf("round %d: %s preempted again (%s; stopping %v, already for %v)", f.round, victim.RunID, p.Key, victim.Stopping, victim.PreemptedFor)
		}
		switch p.Key {
		case "reclaim:" + by.Project:
			taken[victim.Project] += float64(len(victim.GPUs))
			if victim.Project == by.Project || used[victim.Project]-taken[victim.Project] < quota[victim.Project] {
				f.t.Fatalf("round %d: reclaimed %s of %s, which is not borrowed (%g used, quota %g)", f.round, victim.RunID, victim.Project,
					used[victim.Project], quota[victim.Project])
			}
		case "priority:" + by.Project:
			if victim.Project != by.Project || victim.Priority >= by.Priority {
				f.t.Fatalf("round %d: %s (priority %d) preempted %s of %s (priority %d)", f.round, by.ID, by.Priority, victim.RunID, victim.Project, victim.Priority)
			}
		default:
			f.t.Fatalf("round %d: preemption %+v has an unknown reason", f.round, p)
		}
	}
}

// checkNoCycle fails if some run preempted, directly or through others, a
// run that preempted it.
func (f *fleetSim) checkNoCycle() {
	f.t.Helper()
	state := map[string]int{} // 1 on the path, 2 done
	var visit func(string) bool
	visit = func(r string) bool {
		state[r] = 1
		for _, v := range f.edges[r] {
			if state[v] == 1 || (state[v] == 0 && visit(v)) {
				f.t.Errorf("preemption cycle through %s → %s", r, v)
				return true
			}
		}
		state[r] = 2
		return false
	}
	for r := range f.edges {
		if state[r] == 0 && visit(r) {
			return
		}
	}
}

// TestPropertyQuotaGuaranteedAndReclaimed: over random fleets, quotas and
// bursts of random priorities, once the fleet settles no project is below
// its quota while it has work waiting that its quota would hold; every
// preemption on the way was allowed (fleetSim.check) and none made a cycle.
func TestPropertyQuotaGuaranteedAndReclaimed(t *testing.T) {
	preempted := map[string]int{}
	defer func() {
		t.Logf("preemptions over all seeds: %v", preempted)
		if preempted["reclaim"] == 0 || preempted["priority"] == 0 {
			t.Errorf("the workloads exercised too little: preemptions %v, want both kinds", preempted)
		}
	}()
	for seed := int64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewSource(seed))
		nodes := 2 + rng.Intn(6)
		capacity := 8 * nodes
		var projects []Project
		left := capacity
		for k := range 2 + rng.Intn(3) {
			q := rng.Intn(left/2 + 1)
			left -= q
			projects = append(projects, gpuQuota(fmt.Sprintf("p%d", k), q, float64(1+rng.Intn(3))))
		}
		f := newFleetSim(t, seed, nodes, projects)
		for round := 0; round < 60; round++ {
			for range rng.Intn(6) {
				p := projects[rng.Intn(len(projects))]
				f.submit(p.Name, 1, rng.Intn(3)*10, 1+rng.Intn(30))
			}
			f.step()
			f.finish()
		}
		// Settle: no arrivals, no departures, until nothing changes for
		// longer than the preemption window.
		quiet := 0
		for quiet <= f.window+1 {
			if f.step() {
				quiet = 0
			} else {
				quiet++
			}
			if f.round > 5000 {
				t.Fatalf("seed %d: no settling after %d rounds", seed, f.round)
			}
		}
		used := map[string]int{}
		for _, a := range f.running {
			used[a.Project] += len(a.gpus)
		}
		for _, r := range f.pending {
			p := projects[slices.IndexFunc(projects, func(p Project) bool { return p.Name == r.Project })]
			if used[p.Name]+r.GPUs <= p.GPUs["H100"] {
				t.Errorf("seed %d: project %s holds %d of its quota of %d H100 while %s waits: %s", seed, p.Name, used[p.Name],
					p.GPUs["H100"], r.ID, Schedule(f.snapshot()).Waiting[r.ID])
			}
		}
		f.checkNoCycle()
		for k, n := range f.preemptions {
			preempted[k] += n
		}
	}
}

// TestPropertyFairShareFollowsWeights: projects with no quota and endless
// queues share a contended fleet in proportion to their weights over a
// long horizon, within 10% of each one's due (1,000 rounds; 400 in short
// mode, within 15%).
func TestPropertyFairShareFollowsWeights(t *testing.T) {
	for seed := int64(1); seed <= 3; seed++ {
		rng := rand.New(rand.NewSource(seed))
		projects := []Project{{Name: "a", Weight: 1}, {Name: "b", Weight: 2}, {Name: "c", Weight: 3 + float64(rng.Intn(3))}}
		f := newFleetSim(t, seed, 4, projects)
		rounds := 1000
		if testing.Short() {
			rounds = 400 // CI's short mode, under the race detector
		}
		for round := 0; round < rounds; round++ {
			for _, p := range projects {
				for len(f.queued(p.Name)) < 40 {
					f.submit(p.Name, 1+rng.Intn(2), 0, 1+rng.Intn(20))
				}
			}
			f.step()
			f.finish()
		}
		total, weights := 0.0, 0.0
		for _, p := range projects {
			total += f.gpuRounds[p.Name]
			weights += p.Weight
		}
		for _, p := range projects {
			got, due := f.gpuRounds[p.Name]/total, p.Weight/weights
			t.Logf("seed %d: project %s (weight %g): %.3f of the GPU time, due %.3f", seed, p.Name, p.Weight, got, due)
			if tolerance := map[bool]float64{false: 0.1, true: 0.15}[testing.Short()]; math.Abs(got-due) > tolerance*due {
				t.Errorf("seed %d: project %s (weight %g) had %.3f of the GPU time, due %.3f", seed, p.Name, p.Weight, got, due)
			}
		}
		f.checkNoCycle()
	}
}

// queued is a project's pending runs.
func (f *fleetSim) queued(project string) []simRun {
	var out []simRun
	for _, r := range f.pending {
		if r.Project == project {
			out = append(out, r)
		}
	}
	return out
}
