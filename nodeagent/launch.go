package nodeagent

import (
	"context"
	"sync"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// prestartStep is one stage of a launch, run in order by launch the way
// Nomad's task runner runs its prestart hooks: the image, then the
// Artifacts, then the container (one file each, step_*.go). The runtime
// does the work; a step says what to ask it for and when there is nothing to
// ask.
//
// A step that fails ends the launch with its error, and the steps before it
// are not undone: an image pulled or an Artifact copied stays held, so the
// launch's redelivery finds it there. Steps are stateless and safe for
// concurrent launches.
//
// report, when not nil, is told how the step goes (the launch asked,
// LaunchWorkloadCommand.ReportProgress); it rate-limits itself.
type prestartStep interface {
	run(ctx context.Context, rt Runtime, l nodeproto.LaunchWorkloadCommand, report func(nodeproto.PrepareProgress)) error
}

// launchSteps is every launch's steps, in order.
var launchSteps = []prestartStep{imageStep{}, artifactsStep{}, containerStep{}}

// launch runs the prestart steps of one launch. A launch that takes longer
// than preparingAfter (a pull, a copy) is reported as preparing meanwhile.
func (a *Agent) launch(ctx context.Context, l nodeproto.LaunchWorkloadCommand) error {
	preparing := nodeproto.WorkloadObservation{WorkloadKey: l.WorkloadKey, Image: l.Image, Phase: nodeproto.PhasePreparing, Timeout: l.Timeout}
	defer a.reportPreparingAfter(preparing)()
	var report func(nodeproto.PrepareProgress)
	if l.ReportProgress {
		p := &progressReporter{agent: a, preparing: preparing, start: a.now()}
		defer p.stop()
		report = p.report
	}
	for _, step := range launchSteps {
		if err := step.run(ctx, a.runtime, l, report); err != nil {
			return err
		}
	}
	return nil
}

// progressEvery is the least time between two progress reports of one
// step: each is a durable write on the node and a transaction on the
// control plane, so a pull of minutes costs tens of them, not thousands.
const progressEvery = 2 * time.Second

// progressReporter reports a launch's progress as preparing observations:
// none before preparingAfter (a launch that quick is never reported as
// preparing), then a step's first report and at most one every
// progressEvery after it. Once stop returns nothing more is reported, so
// the launch's result is never followed by a stale progress report.
type progressReporter struct {
	agent     *Agent
	preparing nodeproto.WorkloadObservation
	start     time.Time

	mu       sync.Mutex
	stopped  bool
	lastStep string
	last     time.Time
}

func (p *progressReporter) report(pr nodeproto.PrepareProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.agent.now()
	if p.stopped || now.Sub(p.start) < p.agent.preparingAfter || (pr.Step == p.lastStep && now.Sub(p.last) < progressEvery) {
		return
	}
	p.lastStep, p.last = pr.Step, now
	o := p.preparing
	o.Progress = &pr
	p.agent.spoolObservation(o, false)
}

func (p *progressReporter) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
}

// defaultPreparingAfter is how long a launch runs before the agent reports
// its workload as preparing. A launch whose image is already on the machine
// ends well within it, and is then reported once, by its result and the
// running observation that follows, in one delivery; a launch that pulls
// shows up as preparing while it does. Reporting every launch as preparing
// up front cost the node a durable write and a delivery per run, and the
// control plane a transaction, for a state that usually lasted 100 ms.
const defaultPreparingAfter = time.Second

// reportPreparingAfter reports o (a preparing observation) once the launch
// has taken preparingAfter, unless the workload was reported on meanwhile.
// The returned func cancels the report, or waits for one under way, so a
// result spooled after it is spooled after the preparing report too.
func (a *Agent) reportPreparingAfter(o nodeproto.WorkloadObservation) (cancel func()) {
	done := make(chan struct{})
	t := time.AfterFunc(a.preparingAfter, func() {
		defer close(done)
		a.spoolObservation(o, true)
	})
	return func() {
		if !t.Stop() {
			<-done
		}
	}
}
