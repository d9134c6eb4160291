package nodeagent

import (
	"context"
	"slices"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// GPUHealthSampler is an optional Runtime extension: a runtime that can
// sample its GPUs' health (nodeproto.GPUHealth, reported with its Facts).
// The agent calls SampleGPUs every GPU sample period and reads the facts
// again at once after it, so a card that went bad reaches the control plane
// within a sample period rather than a heartbeat later.
type GPUHealthSampler interface {
	// SampleGPUs samples once; the error is ctx ending. A machine without
	// GPUs makes it a no-op.
	SampleGPUs(ctx context.Context) error
}

// DefaultGPUSampleEvery is the GPU sample period when WithGPUSampleEvery
// sets none: short enough that a card that fell off the bus is quarantined
// before many placements could reach it, long enough that sampling eight
// GPUs costs the machine a fraction of a percent of one core
// (docs/performance.md).
const DefaultGPUSampleEvery = 10 * time.Second

// WithGPUSampleEvery sets how often the agent samples its GPUs' health
// (when its runtime is a GPUHealthSampler).
func WithGPUSampleEvery(d time.Duration) Option { return func(a *Agent) { a.gpuSampleEvery = d } }

// gpuLoop samples the GPUs every period and wakes the facts loop after each
// sample.
func (a *Agent) gpuLoop(ctx context.Context) {
	sampler, ok := a.runtime.(GPUHealthSampler)
	if !ok {
		return
	}
	every := a.gpuSampleEvery
	if every <= 0 {
		every = DefaultGPUSampleEvery
	}
	for {
		if err := sampler.SampleGPUs(ctx); err != nil && ctx.Err() != nil {
			return
		}
		select {
		case a.factsCh <- struct{}{}:
		default:
		}
		if !sleep(ctx, every) {
			return
		}
	}
}

// GPUDiagnoser is an optional Runtime extension: a runtime that can run an
// active diagnostic of its GPUs (DCGM's `dcgmi diag -r 1`), whose findings
// its facts then report as each GPU's health and notes.
type GPUDiagnoser interface {
	// DiagnoseGPUs runs the diagnostic once. done is false when there is
	// nothing to diagnose yet (the GPUs were not listed yet), and the agent
	// tries again after the next sample; true when the run is over,
	// whatever it found or failed to do (a runtime with no diagnostic
	// tool says true at once). The error is ctx ending.
	DiagnoseGPUs(ctx context.Context) (done bool, err error)
}

// DefaultGPUDiagEvery is the period of the active diagnostic when
// WithGPUDiagEvery sets none: once a day, beside the run at the agent's
// start. The quick diagnostic costs seconds of the host engine's time and
// catches what builds up slowly (pending row remaps, a retired page
// awaiting a reset), which the sampler's signals mostly catch sooner.
const DefaultGPUDiagEvery = 24 * time.Hour

// WithGPUDiagEvery sets how often the agent runs its runtime's GPU
// diagnostic (when the runtime is a GPUDiagnoser) after the run at its
// start; 0 runs it only at the start.
func WithGPUDiagEvery(d time.Duration) Option {
	return func(a *Agent) { a.gpuDiagEvery, a.gpuDiagSet = d, true }
}

// gpuDiagLoop runs the diagnostic once the GPUs are listed, then every
// period, and wakes the facts loop after each run.
func (a *Agent) gpuDiagLoop(ctx context.Context) {
	diag, ok := a.runtime.(GPUDiagnoser)
	if !ok {
		return
	}
	every := a.gpuDiagEvery
	if !a.gpuDiagSet {
		every = DefaultGPUDiagEvery
	}
	retry := a.gpuSampleEvery
	if retry <= 0 {
		retry = DefaultGPUSampleEvery
	}
	for {
		done, err := diag.DiagnoseGPUs(ctx)
		if err != nil && ctx.Err() != nil {
			return
		}
		wait := retry
		if done {
			select {
			case a.factsCh <- struct{}{}:
			default:
			}
			if every <= 0 {
				return
			}
			wait = every
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}

// GPUInventoryKeeper is an optional Runtime extension: a runtime whose
// facts list every GPU the machine listed (a vanished card kept, as sick)
// and that can be told, after the agent restarts, which GPUs were listed
// before. The agent keeps that list in its state file from each facts
// reading and gives it back at its start, so a card that vanished is still
// reported missing after a restart, until the node is enrolled again or
// the agent is started with WithForgetGPUs.
type GPUInventoryKeeper interface {
	RestoreGPUs(known []nodeproto.Accelerator)
}

// WithForgetGPUs makes the agent drop the GPU inventory its state file
// kept, at its start: an operator who took a card out says so this way (or
// by enrolling the node again).
func WithForgetGPUs() Option { return func(a *Agent) { a.forgetGPUs = true } }

// restoreGPUs gives the runtime the GPUs the state file kept (or forgets
// them, with WithForgetGPUs). A state it cannot read is logged, and the
// inventory starts from what the tool lists.
func (a *Agent) restoreGPUs() {
	keeper, ok := a.runtime.(GPUInventoryKeeper)
	if !ok {
		return
	}
	if a.forgetGPUs {
		if err := a.state.SaveGPUInventory(nil); err != nil {
			a.logger.Warn("forget the kept GPU inventory", "err", err)
		}
		a.logger.Info("GPU inventory forgotten (--forget-gpus): the GPUs listed now are the machine's")
		return
	}
	known, err := a.state.GPUInventory()
	if err != nil {
		a.logger.Warn("GPU inventory not restored", "err", err)
		return
	}
	a.savedGPUs = known
	if len(known) > 0 {
		keeper.RestoreGPUs(known)
	}
}

// keepGPUs writes the facts' GPUs to the state file when they are not the
// ones it holds (called from the facts loop only).
func (a *Agent) keepGPUs(listed []nodeproto.Accelerator) {
	if _, ok := a.runtime.(GPUInventoryKeeper); !ok || len(listed) == 0 || slices.Equal(listed, a.savedGPUs) {
		return
	}
	if err := a.state.SaveGPUInventory(listed); err != nil {
		a.logger.Warn("keep the GPU inventory", "err", err)
		return
	}
	a.savedGPUs = slices.Clone(listed)
}
