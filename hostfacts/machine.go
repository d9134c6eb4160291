package hostfacts

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// MemTotal reads MemTotal from a meminfo file, in bytes.
func MemTotal(path string) (int64, error) {
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

// Limits is what the cgroups this process is in allow; zero means no
// limit found.
type Limits struct {
	// CPUs is the tightest CPU quota, in cores.
	CPUs float64
	// MemoryBytes is the tightest memory limit.
	MemoryBytes int64
}

// CgroupLimits finds this process's cgroup from <procRoot>/self/cgroup
// and takes the tightest CPU quota and memory limit on the way from it up to
// the hierarchy's root (a parent's limit binds its children). Directories
// that do not exist are skipped, which is what makes it work both on a host
// and inside a container whose cgroup namespace mounts its own cgroup as the
// root. Unreadable files mean no limit: this is a cap on a measured figure,
// never a figure of its own.
func CgroupLimits(procRoot, cgroupRoot string) Limits {
	var limits Limits
	raw, err := os.ReadFile(filepath.Join(procRoot, "self", "cgroup"))
	if err != nil {
		return limits
	}
	tighten := func(cpus float64, memory int64) {
		if cpus > 0 && (limits.CPUs == 0 || cpus < limits.CPUs) {
			limits.CPUs = cpus
		}
		if memory > 0 && (limits.MemoryBytes == 0 || memory < limits.MemoryBytes) {
			limits.MemoryBytes = memory
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
// controller list ("cpu,cpuacct") and under the single controller's name,
// which distributions provide as a link.
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
// anything unreadable is no limit (0).
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

// Capacity is what this machine can give workloads: CPUs (fractional under
// a CPU quota) and memory in bytes.
type Capacity struct {
	CPUs        float64
	MemoryBytes int64
}

// MeasureCapacity measures this machine's capacity: numCPU capped by a
// cgroup CPU quota, and MemTotal from procRoot/meminfo capped by the
// tightest cgroup memory limit on this process's cgroup path (a parent's
// limit binds its children). A machine's containers can have no more than
// the agent's own cgroup allows, which is why the limit and not the host's
// total is the honest figure when the agent itself runs in a container.
// CPUs are always measured; memory that cannot be read is 0, with the error.
func MeasureCapacity(procRoot, cgroupRoot string, numCPU int) (Capacity, error) {
	limits := CgroupLimits(procRoot, cgroupRoot)
	c := Capacity{CPUs: float64(numCPU)}
	if limits.CPUs > 0 && limits.CPUs < c.CPUs {
		c.CPUs = limits.CPUs
	}
	total, err := MemTotal(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return c, err
	}
	c.MemoryBytes = total
	if limits.MemoryBytes > 0 && limits.MemoryBytes < total {
		c.MemoryBytes = limits.MemoryBytes
	}
	return c, nil
}

// DiskFree is the space an unprivileged writer can use on the filesystem
// holding path, or, while path does not exist yet, its nearest existing
// ancestor: a directory created on first use (the artifact root) lands on
// that filesystem, so it is the answer until then.
func DiskFree(path string) (int64, error) {
	for {
		var st syscall.Statfs_t
		err := syscall.Statfs(path, &st)
		if err == nil {
			return int64(st.Bavail) * int64(st.Bsize), nil
		}
		parent := filepath.Dir(path)
		if !errors.Is(err, syscall.ENOENT) || parent == path {
			return 0, err
		}
		path = parent
	}
}
