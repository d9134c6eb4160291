package nodeagent

import (
	"context"
	"time"
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
