package fnagent

import (
	"runtime"

	"github.com/mercator/mercator/hostfacts"
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
// its memory and CPUs as hostfacts.MeasureCapacity reads them (capped by
// the agent's own cgroup limits), less headroom from the memory
// (DefaultHeadroom when headroom is 0). GPUs are not detected here; the
// composition root, which asks the node's runtime, adds their IDs.
func DetectCapacity(headroom int64) (Capacity, error) {
	return detectCapacity("/proc", "/sys/fs/cgroup", runtime.NumCPU(), headroom)
}

func detectCapacity(procRoot, cgroupRoot string, numCPU int, headroom int64) (Capacity, error) {
	measured, err := hostfacts.MeasureCapacity(procRoot, cgroupRoot, numCPU)
	if err != nil {
		return Capacity{}, err
	}
	total := measured.MemoryBytes
	if headroom <= 0 {
		headroom = DefaultHeadroom(total)
	}
	return Capacity{MemoryBytes: max(0, total-headroom), MilliCPUs: int64(measured.CPUs * 1000)}, nil
}
