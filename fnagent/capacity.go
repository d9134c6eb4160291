package fnagent

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
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
	total, err := memTotal(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return Capacity{}, err
	}
	limits := readCgroupLimits(procRoot, cgroupRoot)
	if limits.memory > 0 && limits.memory < total {
		total = limits.memory
	}
	cpus := float64(numCPU)
	if limits.cpus > 0 && limits.cpus < cpus {
		cpus = limits.cpus
	}
	if headroom <= 0 {
		headroom = DefaultHeadroom(total)
	}
	return Capacity{MemoryBytes: max(0, total-headroom), MilliCPUs: int64(cpus * 1000)}, nil
}

// memTotal reads MemTotal from a meminfo file, in bytes.
func memTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: MemTotal %q: %w", path, fields[1], err)
			}
			return kb * 1024, nil
		}
	}
	if err := scanner.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no MemTotal line", path)
}

// cgroupLimits is what the cgroups this process is in allow; zero means no
// limit found.
type cgroupLimits struct {
	cpus   float64
	memory int64
}

// readCgroupLimits finds this process's cgroup in <procRoot>/self/cgroup and
// takes the tightest CPU quota and memory limit from it up to the root.
// Directories that do not exist are skipped, which makes it work on a host
// and inside a container whose cgroup namespace shows its own cgroup as the
// root. Unreadable files mean no limit: this caps a measured figure and is
// never a figure of its own. (The node agent reads the same files for its
// facts; this copy keeps fnagent free of the agent package.)
func readCgroupLimits(procRoot, cgroupRoot string) cgroupLimits {
	var limits cgroupLimits
	raw, err := os.ReadFile(filepath.Join(procRoot, "self", "cgroup"))
	if err != nil {
		return limits
	}
	tighten := func(cpus float64, memory int64) {
		if cpus > 0 && (limits.cpus == 0 || cpus < limits.cpus) {
			limits.cpus = cpus
		}
		if memory > 0 && (limits.memory == 0 || memory < limits.memory) {
			limits.memory = memory
		}
	}
	_, statErr := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers"))
	unified := statErr == nil
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		controllers, path := strings.Split(parts[1], ","), parts[2]
		switch {
		case unified && parts[0] == "0" && parts[1] == "":
			for _, dir := range cgroupAncestors(cgroupRoot, path) {
				tighten(cpuMax(filepath.Join(dir, "cpu.max")), readLimit(filepath.Join(dir, "memory.max")))
			}
		case !unified && slices.Contains(controllers, "cpu"):
			for _, mount := range v1Mounts(cgroupRoot, parts[1], "cpu") {
				for _, dir := range cgroupAncestors(mount, path) {
					quota := readLimit(filepath.Join(dir, "cpu.cfs_quota_us"))
					period := readLimit(filepath.Join(dir, "cpu.cfs_period_us"))
					if quota > 0 && period > 0 {
						tighten(float64(quota)/float64(period), 0)
					}
				}
			}
		case !unified && slices.Contains(controllers, "memory"):
			for _, mount := range v1Mounts(cgroupRoot, parts[1], "memory") {
				for _, dir := range cgroupAncestors(mount, path) {
					tighten(0, readLimit(filepath.Join(dir, "memory.limit_in_bytes")))
				}
			}
		}
	}
	return limits
}

// v1Mounts lists where a v1 hierarchy may be mounted: under its joined
// controller list ("cpu,cpuacct") and under the single controller's name.
func v1Mounts(root, joined, controller string) []string {
	mounts := []string{filepath.Join(root, joined)}
	if joined != controller {
		mounts = append(mounts, filepath.Join(root, controller))
	}
	return mounts
}

// cgroupAncestors lists the existing directories from root/path up to root.
func cgroupAncestors(root, path string) []string {
	var dirs []string
	rel := filepath.Clean("/" + path)
	for {
		dir := filepath.Join(root, rel)
		if info, err := os.Stat(dir); err == nil && info.IsDir() {
			dirs = append(dirs, dir)
		}
		if rel == "/" {
			return dirs
		}
		rel = filepath.Dir(rel)
	}
}

// cpuMax reads a v2 cpu.max ("max 100000" or "150000 100000") as cores.
func cpuMax(path string) float64 {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(raw))
	if len(fields) != 2 || fields[0] == "max" {
		return 0
	}
	quota, err1 := strconv.ParseFloat(fields[0], 64)
	period, err2 := strconv.ParseFloat(fields[1], 64)
	if err1 != nil || err2 != nil || quota <= 0 || period <= 0 {
		return 0
	}
	return quota / period
}

// readLimit reads a file holding one integer; "max", a negative number or
// anything unreadable is no limit (0). v1's "unlimited" is a huge number,
// which the caller's comparison with MemTotal absorbs.
func readLimit(path string) int64 {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
