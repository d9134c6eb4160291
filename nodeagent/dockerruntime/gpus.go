package dockerruntime

import (
	"context"
	"strconv"
	"time"

	"github.com/mercator/mercator/hostfacts"
	"github.com/mercator/mercator/nodeproto"
)

// WithKernelLog points the GPU health sampler at the kernel's message log
// ("" for hostfacts.DefaultKernelLog, /dev/kmsg), where the NVIDIA module
// writes its Xid reports. A test stands in a kernel with a regular file it
// appends to.
func WithKernelLog(path string) Option {
	return func(docker *Runtime) { docker.kernelLog = path }
}

// SampleGPUs samples the health of every GPU this machine listed (see
// hostfacts.GPUSampler), which Facts reports, and counts the figures of
// each running workload's GPUs towards its usage summary, which Observe
// reports. It does nothing on a machine that has listed none. The error is
// ctx ending.
func (docker *Runtime) SampleGPUs(ctx context.Context) error {
	s := docker.gpuSampler()
	if err := s.Sample(ctx); err != nil {
		return err
	}
	docker.usage.Add(s.Readings(), time.Now())
	return nil
}

// gpuSampler is the runtime's sampler, made on first use from the options
// with the usage tracker beside it.
func (docker *Runtime) gpuSampler() *hostfacts.GPUSampler {
	docker.gpuOnce.Do(func() {
		docker.gpus = hostfacts.NewGPUSampler(docker.acceleratorTool, docker.kernelLog, 0, nil)
		docker.usage = hostfacts.NewUsageTracker(0)
	})
	return docker.gpus
}

// withGPUUsage tells the usage tracker which workloads run on which GPUs,
// and gives each observation of a workload with GPUs its usage summary (the
// final one once it has exited).
func (docker *Runtime) withGPUUsage(observations []nodeproto.WorkloadObservation) {
	docker.gpuSampler()
	running, present := map[string][]string{}, map[string]bool{}
	for _, o := range observations {
		if len(o.GPUs) == 0 {
			continue
		}
		key := usageKey(o.WorkloadKey)
		present[key] = true
		if o.Phase == nodeproto.PhaseRunning {
			running[key] = o.GPUs
		}
	}
	docker.usage.Running(running, present)
	now := time.Now()
	for i := range observations {
		if o := &observations[i]; len(o.GPUs) > 0 {
			o.GPUUsage = docker.usage.Published(usageKey(o.WorkloadKey), o.Phase == nodeproto.PhaseExited, now)
		}
	}
}

func usageKey(k nodeproto.WorkloadKey) string { return k.RunID + "/" + strconv.Itoa(k.Attempt) }

// withGPUHealth makes facts list every GPU this machine has listed since the
// agent started (a card that vanished stays, as sick) and states each one's
// health and the sampler's notes.
func (docker *Runtime) withGPUHealth(facts *nodeproto.NodeFacts) {
	s := docker.gpuSampler()
	facts.Accelerators = s.Enroll(facts.Accelerators)
	facts.GPUHealth = s.Health()
	facts.Notes = append(facts.Notes, s.Notes()...)
}

// WithDCGMI names DCGM's command-line tool (a path, or a name looked up on
// PATH such as hostfacts.DefaultDCGMI), through which DiagnoseGPUs runs
// the quick diagnostic; without it, or with "", no diagnostic runs.
func WithDCGMI(tool string) Option {
	return func(docker *Runtime) { docker.dcgmi = tool }
}

// DiagnoseGPUs runs DCGM's quick diagnostic (hostfacts.GPUSampler.Diagnose)
// once, when a tool is set: a GPU it fails is reported sick by Facts, its
// warnings and its own failures as notes. done is false while no facts
// reading has listed the GPUs yet.
func (docker *Runtime) DiagnoseGPUs(ctx context.Context) (bool, error) {
	if docker.dcgmi == "" {
		return true, nil
	}
	return docker.gpuSampler().Diagnose(ctx, docker.dcgmi)
}

// RestoreGPUs gives the sampler the GPUs this machine listed before the
// agent restarted (nodeagent.GPUInventoryKeeper).
func (docker *Runtime) RestoreGPUs(known []nodeproto.Accelerator) {
	docker.gpuSampler().Restore(known)
}
