package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	dockerclient "github.com/docker/docker/client"

	"github.com/mercator/mercator/api"
)

// BenchmarkLaunchLatency measures, for an image already on the node:
//
//   - submit → running: from the start of the submit call to the daemon's
//     own StartedAt of the run's container, against the same interval for a
//     container of the same image with the same limits created and started
//     through the Docker API from this process (rawLaunch), measured in the
//     same benchmark run; reported as medians and their ratio;
//   - exit → terminal: from the daemon's FinishedAt to the moment the
//     control plane recorded the run as ended.
//
// Run it with: go test ./e2e -run '^$' -bench LaunchLatency -benchtime 1x
// (each iteration takes MERCATOR_BENCH_SAMPLES samples of each, default 25).
func BenchmarkLaunchLatency(b *testing.B) {
	samples := benchSamples(b)
	c := startCluster(b)
	c.startAgent("bench")
	docker, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		b.Fatal(err)
	}
	defer docker.Close()
	for i := 0; i < b.N; i++ {
		var mercator, raw, exitLag []time.Duration
		// Warm: the first run pulls the image onto the node.
		c.wait(c.submit(api.RunSpec{Command: []string{"echo", "warm"}}).ID)
		for s := 0; s < samples; s++ {
			raw = append(raw, rawLaunch(b, docker, c.workload, &container.HostConfig{Resources: container.Resources{NanoCPUs: 5e8, Memory: 64 << 20}}))

			start := time.Now()
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
		b.ReportMetric(float64(mr.Microseconds())/1000, "docker-api-ms")
		b.ReportMetric(float64(mm)/float64(mr), "ratio")
		b.ReportMetric(float64(ml.Microseconds())/1000, "exit-to-terminal-ms")
		fmt.Printf("launch latency over %d samples: mercator submit→running median %v, raw Docker API create+start median %v, ratio %.2f (target ≤ 1.15); exit→terminal median %v (target ≤ 100ms)\n",
			samples, mm.Round(time.Millisecond), mr.Round(time.Millisecond), float64(mm)/float64(mr), ml.Round(time.Millisecond))
	}
}

// benchSamples is MERCATOR_BENCH_SAMPLES, the samples of each kind one
// iteration of a latency benchmark takes: 25 unless set.
func benchSamples(b *testing.B) int {
	v := os.Getenv("MERCATOR_BENCH_SAMPLES")
	if v == "" {
		return 25
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("MERCATOR_BENCH_SAMPLES=%q: want a positive count", v)
	}
	return n
}

// rawLaunch creates and starts a container of image with hostConfig (the
// limits the benchmark's runs ask for), through the Docker API from this
// process as the agent does (a `docker run` would add the CLI's own process
// start to the baseline), and returns the time from the create call to the
// daemon's StartedAt.
func rawLaunch(b *testing.B, docker *dockerclient.Client, image string, hostConfig *container.HostConfig) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	created, err := docker.ContainerCreate(ctx, &container.Config{Image: image, Cmd: []string{"echo", "raw"}}, hostConfig, nil, nil, "")
	if err != nil {
		b.Fatalf("create the baseline container: %v", err)
	}
	defer docker.ContainerRemove(ctx, created.ID, container.RemoveOptions{Force: true})
	if err := docker.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		b.Fatalf("start the baseline container: %v", err)
	}
	insp, err := docker.ContainerInspect(ctx, created.ID)
	if err != nil {
		b.Fatal(err)
	}
	started, err := time.Parse(time.RFC3339Nano, insp.State.StartedAt)
	if err != nil {
		b.Fatal(err)
	}
	return started.Sub(start)
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
