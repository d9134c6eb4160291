// Package hostfacts reads what this machine is and can give to workloads,
// from the machine itself: its memory from the kernel and the CPU and memory
// limits of the cgroups this process runs in (v1 and v2), the free space of
// a filesystem, and the accelerators a container launched here can be given
// (NVIDIA GPUs, from the vendor tool, the kernel module's report and the
// container hook), and, sample after sample, each GPU's health and use
// (gpuhealth.go parses the tool's and the kernel's reports, gpusampler.go
// keeps what one sample cannot know, gpuusage.go sums a workload's GPU
// figures). The node agent's facts and the function engine's resource
// tracker both size themselves from it, so a process started inside a
// container reports the container's limits, not the host's.
//
// Every reading takes the roots it reads (normally /proc and /sys/fs/cgroup)
// or the tool it runs, so tests can stand in any machine. It imports no
// container runtime. Imported by nodeagent/dockerruntime, artifactcache,
// fnagent and the composition root.
package hostfacts
