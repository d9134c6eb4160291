package nodeagent

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// progressRuntime pulls images by steps the test sends: each step reports
// its bytes, then waits for the next; a closed channel ends the pull.
type progressRuntime struct {
	*memRuntime
	steps chan [2]int64
	acks  chan struct{}
}

func (p *progressRuntime) PrepareImageProgress(ctx context.Context, c nodeproto.PrepareImageCommand, report func(done, total int64)) error {
	for s := range p.steps {
		report(s[0], s[1])
		p.acks <- struct{}{}
	}
	return p.memRuntime.PrepareImage(ctx, c)
}

// progressOf is the progress of every workload event delivered for run, in
// order, and whether any came after the launch's result.
func (c *chanTransport) progressOf(run string) (got []nodeproto.PrepareProgress, afterResult bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	result := false
	for _, e := range c.events {
		switch {
		case e.Kind == nodeproto.EventResult && e.Result.Workload != nil && e.Result.Workload.RunID == run:
			result = true
		case e.Kind == nodeproto.EventWorkload && e.Workload.RunID == run && e.Workload.Progress != nil:
			got = append(got, *e.Workload.Progress)
			afterResult = afterResult || result
		}
	}
	return got, afterResult
}

// TestPullProgressReportedRateLimited: a launch that asks for progress has
// its pull's bytes reported as preparing observations, none in its first
// preparingAfter, then at most one every progressEvery, and none after its
// result.
func TestPullProgressReportedRateLimited(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	rt := &progressRuntime{memRuntime: newMemRuntime(), steps: make(chan [2]int64), acks: make(chan struct{})}
	tr := &chanTransport{commands: make(chan nodeproto.Command)}
	defer startTestAgent(t, rt, tr, t.TempDir(), WithClock(clock))()

	cmd := launch("pull", 5)
	cmd.LaunchWorkload.ReportProgress = true
	tr.commands <- cmd
	step := func(done, total int64) { rt.steps <- [2]int64{done, total}; <-rt.acks }
	step(10, 100) // within preparingAfter: not reported
	advance(defaultPreparingAfter)
	step(20, 100) // reported
	step(30, 100) // within progressEvery of it: not reported
	advance(progressEvery)
	step(50, 100) // reported
	close(rt.steps)
	waitUntil(t, "the launch's result", func() bool { return len(tr.results("pull")) == 1 })
	got, late := tr.progressOf("r-pull")
	want := []nodeproto.PrepareProgress{{Step: nodeproto.ProgressImage, DoneBytes: 20, TotalBytes: 100}, {Step: nodeproto.ProgressImage, DoneBytes: 50, TotalBytes: 100}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || late {
		t.Fatalf("progress reported %+v (after the result: %v), want %+v", got, late, want)
	}
}
