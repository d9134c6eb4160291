package scheduler

// Placement throughput. Run it with
//
//	go test -run '^$' -bench . -benchtime 3x ./scheduler
//
// BenchmarkSchedule plans 100,000 queued runs onto simulated fleets of 1,000,
// 10,000 and 50,000 machines of mixed shapes and prints a table of the
// figures; BenchmarkScheduleVersusReference measures the same inputs, cut
// down to what the original one-pass scheduler (reference_test.go) finishes
// in seconds, with both, and reports the ratio. Nothing here asserts a time:
// a benchmark that gates CI on wall-clock time fails on a busy machine, not
// on a slow scheduler.

import (
	"fmt"
	"math/rand"
	"os"
	"testing"
	"text/tabwriter"
	"time"
)

// machineShape is one kind of machine in the simulated fleet.
type machineShape struct {
	name  string
	share int // out of 100
	gpus  int
	model string
	gpuGB int64
	cpu   float64
	memGB int64
}

// benchShapes is the simulated fleet: a quarter each of 8×H100 and 4×A100
// training machines, 1×L4 inference machines, and CPU-only machines.
var benchShapes = []machineShape{
	{"8xH100", 25, 8, "NVIDIA H100 80GB HBM3", 80, 192, 2048},
	{"4xA100", 25, 4, "NVIDIA A100-SXM4-40GB", 40, 96, 1024},
	{"1xL4", 25, 1, "NVIDIA L4", 22, 32, 128},
	{"cpu", 25, 0, "", 0, 64, 256},
}

const benchImages = 20

// benchSnapshot is a fleet of nodes machines and a queue of runs, generated
// from seed: 1% of machines unreachable and 1% cordoned, about a third of the
// GPUs and a fifth of CPU and memory already held by running attempts, each
// machine holding a few of 20 images (the popular ones on most machines).
// The queue is half CPU runs (1–8 CPUs, 2–32 GiB) and half GPU runs: 1 GPU of
// any model or an L4, 2–4 A100s or H100s, 8 H100s, or 1–2 GPUs with at
// least 80 GiB each.
func benchSnapshot(nodes, runs int, seed int64) Snapshot {
	rng := rand.New(rand.NewSource(seed))
	image := func() string {
		// Zipf-like: image 0 is the most popular.
		return fmt.Sprintf("registry.test/team/img%d@sha256:%064d", int(float64(benchImages)*rng.Float64()*rng.Float64()), 0)
	}
	s := Snapshot{Nodes: make([]Node, 0, nodes), Pending: make([]Run, 0, runs)}
	for i := 0; i < nodes; i++ {
		pick, shape := rng.Intn(100), benchShapes[0]
		for _, candidate := range benchShapes {
			if pick < candidate.share {
				shape = candidate
				break
			}
			pick -= candidate.share
		}
		n := Node{ID: fmt.Sprintf("node-%06d", i), Ready: rng.Intn(100) > 0, CPU: shape.cpu, MemoryBytes: shape.memGB * gib,
			UsedGPUs: map[string]bool{}, Images: map[string]bool{}}
		if !n.Ready {
			n.NotReadyReason = "is unreachable"
		}
		n.Cordoned = rng.Intn(100) == 0
		for k := 0; k < shape.gpus; k++ {
			uuid := fmt.Sprintf("GPU-%08x-%04x-0000-0000-%012x", i, k, rng.Int63())
			n.GPUs = append(n.GPUs, GPU{UUID: uuid, Model: shape.model, MemoryBytes: shape.gpuGB * gib})
			if rng.Intn(3) == 0 {
				n.UsedGPUs[uuid] = true
			}
		}
		n.UsedCPU = float64(rng.Intn(int(shape.cpu) / 4))
		n.UsedMemory = int64(rng.Int63n(shape.memGB/4)) * gib
		for k := 0; k < 1+rng.Intn(4); k++ {
			n.Images[image()] = true
		}
		s.Nodes = append(s.Nodes, n)
	}
	for i := 0; i < runs; i++ {
		r := Run{ID: fmt.Sprintf("r-%07d", i), Image: image()}
		switch pick := rng.Intn(100); {
		case pick < 50:
			r.CPU, r.MemoryBytes = float64(1+rng.Intn(8)), int64(2+rng.Intn(31))*gib
		case pick < 70:
			r.GPUs, r.GPUModel, r.CPU, r.MemoryBytes = 1, []string{"", "L4"}[rng.Intn(2)], 4, 16*gib
		case pick < 85:
			r.GPUs, r.GPUModel, r.CPU, r.MemoryBytes = 2+rng.Intn(3), []string{"A100", "H100"}[rng.Intn(2)], 16, 128*gib
		case pick < 95:
			r.GPUs, r.GPUModel, r.CPU, r.MemoryBytes = 8, "H100", 96, 1024*gib
		default:
			r.GPUs, r.GPUMemory, r.CPU, r.MemoryBytes = 1+rng.Intn(2), 80*gib, 8, 64*gib
		}
		s.Pending = append(s.Pending, r)
	}
	return s
}

// benchResult is one measured configuration.
type benchResult struct {
	nodes, runs, placed, waiting int
	perCall                      time.Duration
}

func (r benchResult) placementsPerSecond() float64 {
	return float64(r.placed) / r.perCall.Seconds()
}

func (r benchResult) runsPerSecond() float64 { return float64(r.runs) / r.perCall.Seconds() }

// measure runs schedule b.N times on s and reports the figures.
func measure(b *testing.B, s Snapshot, schedule func(Snapshot) Plan) benchResult {
	b.Helper()
	b.ReportAllocs()
	b.ResetTimer()
	var plan Plan
	for i := 0; i < b.N; i++ {
		plan = schedule(s)
	}
	b.StopTimer()
	result := benchResult{nodes: len(s.Nodes), runs: len(s.Pending), placed: len(plan.Placements), waiting: len(plan.Waiting),
		perCall: b.Elapsed() / time.Duration(b.N)}
	b.ReportMetric(result.placementsPerSecond(), "placements/s")
	b.ReportMetric(result.runsPerSecond(), "runs/s")
	b.ReportMetric(float64(result.placed), "placed")
	return result
}

// BenchmarkSchedule is placement throughput at 1,000, 10,000 and 50,000
// machines with 100,000 queued runs, and how the time of one call grows with
// the fleet.
func BenchmarkSchedule(b *testing.B) {
	const runs = 100_000
	var results []benchResult
	for _, nodes := range []int{1_000, 10_000, 50_000} {
		s := benchSnapshot(nodes, runs, 1)
		var result benchResult
		b.Run(fmt.Sprintf("nodes=%d/runs=%d", nodes, runs), func(b *testing.B) {
			result = measure(b, s, Schedule)
		})
		results = append(results, result)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\nnodes\truns\tplaced\twaiting\ttime/call\tplacements/s\truns/s\ttime vs 1k nodes\t")
	for _, r := range results {
		fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%s\t%.0f\t%.0f\t%.2f×\t\n", r.nodes, r.runs, r.placed, r.waiting,
			r.perCall.Round(time.Millisecond), r.placementsPerSecond(), r.runsPerSecond(), r.perCall.Seconds()/results[0].perCall.Seconds())
	}
	w.Flush()
}

// BenchmarkScheduleVersusReference measures Schedule and the original
// one-pass scheduler on the same inputs, small enough for the original to
// finish, and reports how many times faster Schedule is. The ratio is the
// figure to compare across machines; the absolute times are this machine's.
func BenchmarkScheduleVersusReference(b *testing.B) {
	type row struct{ indexed, reference benchResult }
	var rows []row
	for _, size := range []struct{ nodes, runs int }{{1_000, 5_000}, {10_000, 1_000}} {
		s := benchSnapshot(size.nodes, size.runs, 2)
		var r row
		b.Run(fmt.Sprintf("nodes=%d/runs=%d/indexed", size.nodes, size.runs), func(b *testing.B) { r.indexed = measure(b, s, Schedule) })
		b.Run(fmt.Sprintf("nodes=%d/runs=%d/reference", size.nodes, size.runs), func(b *testing.B) { r.reference = measure(b, s, referenceSchedule) })
		rows = append(rows, r)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\nnodes\truns\tplaced\tindexed\treference\tspeed-up\t")
	for _, r := range rows {
		fmt.Fprintf(w, "%d\t%d\t%d\t%s\t%s\t%.0f×\t\n", r.indexed.nodes, r.indexed.runs, r.indexed.placed,
			r.indexed.perCall.Round(time.Microsecond), r.reference.perCall.Round(time.Millisecond), r.reference.perCall.Seconds()/r.indexed.perCall.Seconds())
	}
	w.Flush()
}

// BenchmarkScheduleGangs is BenchmarkSchedule's 10,000 machines and 100,000
// queued runs with a tenth of the runs made gangs of 2–8 members, beside the
// same queue without gangs, and the gangs again on a fleet of mixed link
// readings, measured in the same run; it reports the ratios. Placements
// count members.
func BenchmarkScheduleGangs(b *testing.B) {
	const nodes, runs = 10_000, 100_000
	plain := benchSnapshot(nodes, runs, 1)
	gangs := benchSnapshot(nodes, runs, 1)
	withGangs(rand.New(rand.NewSource(18)), gangs.Pending)
	// The same gangs on a fleet whose nodes' link readings differ (a third
	// each unmeasured, 1 GB/s and 10 GB/s, with jitter), so gangs whose
	// first choice mixes them look further (linkmatch.go).
	links := benchSnapshot(nodes, runs, 1)
	withGangs(rand.New(rand.NewSource(18)), links.Pending)
	lrng := rand.New(rand.NewSource(28))
	for i := range links.Nodes {
		links.Nodes[i].LinkFloorBPS = []int64{0, 1e9, 10e9}[lrng.Intn(3)] * int64(100+lrng.Intn(10)) / 100
	}
	var without, with, mixed benchResult
	b.Run("without-gangs", func(b *testing.B) { without = measure(b, plain, Schedule) })
	b.Run("gangs-10pct", func(b *testing.B) { with = measure(b, gangs, Schedule) })
	b.Run("gangs-10pct-mixed-links", func(b *testing.B) { mixed = measure(b, links, Schedule) })
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\nqueue\tnodes\truns\tplaced\twaiting\ttime/call\truns/s\ttime vs without\t")
	for _, r := range []struct {
		name string
		benchResult
	}{{"without gangs", without}, {"10% gangs of 2-8", with}, {"the same, links mixed", mixed}} {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%s\t%.0f\t%.2f×\t\n", r.name, r.nodes, r.runs, r.placed, r.waiting,
			r.perCall.Round(time.Millisecond), r.runsPerSecond(), r.perCall.Seconds()/without.perCall.Seconds())
	}
	w.Flush()
}
