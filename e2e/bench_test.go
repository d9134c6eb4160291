package e2e

import (
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
)

// BenchmarkLaunchLatency measures, for an image already on the node:
//
//   - submit → running: from the start of the submit call to the daemon's
//     own StartedAt of the run's container, against the same interval for a
//     raw `docker run -d` of the same image with the same limits, measured
//     in the same benchmark run; reported as medians and their ratio;
//   - exit → terminal: from the daemon's FinishedAt to the moment the
//     control plane recorded the run as ended.
//
// Run it with: go test ./e2e -run '^$' -bench LaunchLatency -benchtime 1x
// (each iteration takes MERCATOR_BENCH_SAMPLES samples of each, default 25).
func BenchmarkLaunchLatency(b *testing.B) {
	samples := 25
	c := startCluster(b)
	c.startAgent("bench")
	for i := 0; i < b.N; i++ {
		var mercator, raw, exitLag []time.Duration
		// Warm: the first run pulls the image onto the node.
		c.wait(c.submit(api.RunSpec{Command: []string{"echo", "warm"}}).ID)
		for s := 0; s < samples; s++ {
			// Raw docker run of the same image and limits.
			start := time.Now()
			out, err := exec.Command("docker", "run", "-d", "--cpus", "0.5", "--memory", "64m", c.workload, "echo", "raw").CombinedOutput()
			if err != nil {
				b.Fatalf("docker run: %v %s", err, out)
			}
			id := strings.TrimSpace(string(out))
			insp, err := exec.Command("docker", "inspect", "--format", "{{.State.StartedAt}}", id).Output()
			if err != nil {
				b.Fatal(err)
			}
			started, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(insp)))
			if err != nil {
				b.Fatal(err)
			}
			raw = append(raw, started.Sub(start))
			exec.Command("docker", "rm", "-f", id).Run()

			start = time.Now()
			run := c.submit(api.RunSpec{Command: []string{"echo", "bench"}, CPU: 0.5, MemoryBytes: 64 << 20})
			done := c.wait(run.ID)
			if done.Status != api.RunSucceeded {
				b.Fatalf("run %s: %s", done.Status, done.Reason)
			}
			a := done.Attempts[len(done.Attempts)-1]
			mercator = append(mercator, a.StartedAt.Sub(start))
			exitLag = append(exitLag, done.FinishedAt.Sub(*a.FinishedAt))
		}
		mm, mr, ml := median(mercator), median(raw), median(exitLag)
		b.ReportMetric(float64(mm.Microseconds())/1000, "mercator-ms")
		b.ReportMetric(float64(mr.Microseconds())/1000, "docker-run-ms")
		b.ReportMetric(float64(mm)/float64(mr), "ratio")
		b.ReportMetric(float64(ml.Microseconds())/1000, "exit-to-terminal-ms")
		fmt.Printf("launch latency over %d samples: mercator submit→running median %v, raw docker run median %v, ratio %.2f (target ≤ 1.15); exit→terminal median %v (target ≤ 100ms)\n",
			samples, mm.Round(time.Millisecond), mr.Round(time.Millisecond), float64(mm)/float64(mr), ml.Round(time.Millisecond))
	}
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
