package dockerruntime

import (
	"context"

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
// hostfacts.GPUSampler); Facts reports the result. It does nothing on a
// machine that has listed none. The error is ctx ending.
func (docker *Runtime) SampleGPUs(ctx context.Context) error {
	return docker.gpuSampler().Sample(ctx)
}

// GPUReadings is the last sample's figures for each GPU that answered, by
// UUID (utilization, memory used, power).
func (docker *Runtime) GPUReadings() map[string]hostfacts.GPUReading {
	return docker.gpuSampler().Readings()
}

// gpuSampler is the runtime's sampler, made on first use from the options.
func (docker *Runtime) gpuSampler() *hostfacts.GPUSampler {
	docker.gpuOnce.Do(func() {
		docker.gpus = hostfacts.NewGPUSampler(docker.acceleratorTool, docker.kernelLog, 0, nil)
	})
	return docker.gpus
}

// withGPUHealth makes facts list every GPU this machine has listed since the
// agent started (a card that vanished stays, as sick) and states each one's
// health and the sampler's notes.
func (docker *Runtime) withGPUHealth(facts *nodeproto.NodeFacts) {
	s := docker.gpuSampler()
	facts.Accelerators = s.Enroll(facts.Accelerators)
	facts.GPUHealth = s.Health()
	facts.Notes = append(facts.Notes, s.Notes()...)
}
