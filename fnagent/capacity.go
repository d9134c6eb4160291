package fnagent

import (
	"github.com/mercator/mercator/machine"

	"path/filepath"
	"runtime"
)

// DefaultHeadroom is the memory kept free of function containers when none
// is configured: a tenth of the machine, at least 256 MiB (the agent, the
// daemon and the page cache need room however small the machine), and never
// more than half of it.
func DefaultHeadroom(total int64) int64 {
	h := max(total/10, 256<<20)
	return min(h, total/2)
}

// DetectCapacity measures what this machine can give function containers:
// memory is MemTotal from /proc/meminfo, capped by the tightest cgroup
// memory limit on this process's cgroup path (v1 memory.limit_in_bytes or v2
// memory.max, on each ancestor, because a parent's limit binds its
// children), less headroom (DefaultHeadroom when headroom is 0); CPU is the
// number of CPUs, capped by a cgroup CPU quota. A machine's containers can
// have no more than the agent's own cgroup allows, which is why the limit
// and not the host's total is the honest figure when the agent itself runs
// in a container. GPUs are not detected here; the node agent, which asks
// the vendor tool, adds their IDs.
func DetectCapacity(headroom int64) (Capacity, error) {
	return detectCapacity("/proc", "/sys/fs/cgroup", runtime.NumCPU(), headroom)
}

func detectCapacity(procRoot, cgroupRoot string, numCPU int, headroom int64) (Capacity, error) {
	total, err := machine.MemTotal(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return Capacity{}, err
	}
	limits := machine.CgroupLimits(procRoot, cgroupRoot)
	if limits.MemoryBytes > 0 && limits.MemoryBytes < total {
		total = limits.MemoryBytes
	}
	cpus := float64(numCPU)
	if limits.CPUs > 0 && limits.CPUs < cpus {
		cpus = limits.CPUs
	}
	if headroom <= 0 {
		headroom = DefaultHeadroom(total)
	}
	return Capacity{MemoryBytes: max(0, total-headroom), MilliCPUs: int64(cpus * 1000)}, nil
}
