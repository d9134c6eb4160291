package scheduler

// Placement throughput with projects. Run it with
//
//	go test -run '^$' -bench ScheduleProjects -benchtime 3x ./scheduler
//
// It plans the same fleet and queue as BenchmarkSchedule's 10,000 machines
// and 100,000 runs twice in one run: plainly, and with 20 projects
// (quotas of H100s, A100s, CPU and memory adding up to about 60% of the
// fleet, weights 1 to 3, decayed history), three priorities, constraints (a
// tenth of the machines labelled pool=secure, where two projects' runs must
// go, and one run in fifty asking for a zone), and the work already on the
// fleet as running attempts of those projects, so quota accounting,
// borrowing, constrained searches and the preemption pass all do their
// work. It
// prints both figures and their ratio, by wall clock and by the process's
// CPU time (which a machine shared with other work disturbs less).

import (
	"fmt"
	"math/rand"
	"os"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"
)

// benchProjects turns s into the same workload shared by n projects.
func benchProjects(s Snapshot, n int, seed int64) Snapshot {
	rng := rand.New(rand.NewSource(seed))
	var h100, a100, cpu, mem float64
	for _, node := range s.Nodes {
		cpu += node.CPU
		mem += float64(node.MemoryBytes)
		for _, g := range node.GPUs {
			switch g.Model {
			case benchShapes[0].model:
				h100++
			case benchShapes[1].model:
				a100++
			}
		}
	}
	share := 0.6 / float64(n)
	for k := range n {
		s.Projects = append(s.Projects, Project{Name: fmt.Sprintf("team-%02d", k),
			GPUs: map[string]int{"H100": int(h100 * share), "A100": int(a100 * share)}, CPU: cpu * share, MemoryBytes: int64(mem * share),
			Weight: float64(1 + rng.Intn(3)), History: rng.Float64() * 0.05})
	}
	nodes := make([]Node, len(s.Nodes))
	copy(nodes, s.Nodes)
	for i := range nodes {
		nodes[i].Labels = map[string]string{"zone": []string{"a", "b", "c"}[i%3]}
		if rng.Intn(10) == 0 {
			nodes[i].Labels["pool"] = "secure"
		}
	}
	s.Nodes = nodes
	pending := make([]Run, len(s.Pending))
	copy(pending, s.Pending)
	for i := range pending {
		k := int(float64(n) * rng.Float64() * rng.Float64()) // a few teams submit most
		pending[i].Project = s.Projects[k].Name
		pending[i].Priority = []int{0, 0, 10, 100}[rng.Intn(4)]
		switch {
		case k == 3 || k == 7: // restricted to the secure pool
			pending[i].Constraints = map[string][]string{"pool": {"secure"}}
		case rng.Intn(50) == 0:
			pending[i].Constraints = map[string][]string{"zone": {"b"}}
		}
	}
	s.Pending = pending
	for i, node := range s.Nodes {
		var gpus []string
		for _, g := range node.GPUs {
			if node.UsedGPUs[g.UUID] {
				gpus = append(gpus, g.UUID)
			}
		}
		if node.UsedCPU == 0 && len(gpus) == 0 {
			continue
		}
		s.Running = append(s.Running, Running{RunID: fmt.Sprintf("r-run-%06d", i), NodeID: node.ID, Project: s.Projects[rng.Intn(n)].Name,
			Priority: []int{0, 10}[rng.Intn(2)], Order: int64(i), CPU: node.UsedCPU, MemoryBytes: node.UsedMemory, GPUs: gpus})
	}
	return s
}

func BenchmarkScheduleProjects(b *testing.B) {
	plain := benchSnapshot(10_000, 100_000, 1)
	withProjects := benchProjects(plain, 20, 1)
	var p, t benchResult
	var preempted int
	var pCPU, tCPU time.Duration
	b.Run("plain", func(b *testing.B) {
		start := cpuTime()
		p = measure(b, plain, Schedule)
		pCPU = (cpuTime() - start) / time.Duration(b.N)
	})
	b.Run("projects=20", func(b *testing.B) {
		start := cpuTime()
		t = measure(b, withProjects, func(s Snapshot) Plan {
			plan := Schedule(s)
			preempted = len(plan.Preemptions)
			return plan
		})
		tCPU = (cpuTime() - start) / time.Duration(b.N)
	})
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\nnodes\truns\tprojects\tplaced\tpreempted\ttime/call\tplacements/s\tvs plain\tCPU/call\tplacements/CPU-s\tvs plain\t")
	perCPU := func(r benchResult, cpu time.Duration) float64 { return float64(r.placed) / cpu.Seconds() }
	fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%s\t%.0f\t%.2f×\t%s\t%.0f\t%.2f×\t\n", p.nodes, p.runs, 0, p.placed, 0, p.perCall.Round(time.Millisecond),
		p.placementsPerSecond(), 1.0, pCPU.Round(time.Millisecond), perCPU(p, pCPU), 1.0)
	fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%s\t%.0f\t%.2f×\t%s\t%.0f\t%.2f×\t\n", t.nodes, t.runs, len(withProjects.Projects), t.placed, preempted,
		t.perCall.Round(time.Millisecond), t.placementsPerSecond(), t.placementsPerSecond()/p.placementsPerSecond(),
		tCPU.Round(time.Millisecond), perCPU(t, tCPU), perCPU(t, tCPU)/perCPU(p, pCPU))
	w.Flush()
}

// cpuTime is the CPU time this process has used, user and system, all
// threads (the collector's included).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
