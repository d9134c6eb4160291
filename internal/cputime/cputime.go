// Package cputime reads the CPU time consumed so far by this process, by
// other processes, by Docker containers and by the whole machine, from
// /proc and the cgroup file system (Linux, cgroup v1 or v2). Benchmarks
// take a Sample before and after a phase and report the difference per
// operation, which says where a machine's CPU went, not just how fast the
// phase ran: on a machine whose cores are saturated, latency is queueing
// and CPU per operation is the figure to shrink.
//
// Benchmarks (fnagent's node benchmark, the end-to-end function
// benchmark) import it; nothing in production does. A figure that cannot
// be read (no such process, no cgroup file) reads as zero.
package cputime

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Sample is the CPU time consumed up to one moment, by whom. Fields are
// cumulative: subtract two samples (Minus) for a phase.
type Sample struct {
	// Self is this process (user and system).
	Self time.Duration
	// Process is the process of the pid given to Take (0: none).
	Process time.Duration
	// Dockerd is the Docker daemon (/var/run/docker.pid).
	Dockerd time.Duration
	// Containerd is containerd and every containerd shim on the machine,
	// which copy the containers' output to the daemon.
	Containerd time.Duration
	// Containers is the containers whose IDs were given to Take.
	Containers time.Duration
	// Machine is every CPU's busy time (all but idle and iowait), which
	// includes work unrelated to the benchmark on a shared machine.
	Machine time.Duration
}

// Take samples now: this process, the process pid (0 for none), the
// daemon, containerd and its shims, the containers with the full IDs ids,
// and the machine.
func Take(pid int, ids []string) Sample {
	s := Sample{Self: Self(), Process: Process(pid), Machine: Machine()}
	if raw, err := os.ReadFile("/var/run/docker.pid"); err == nil {
		daemon, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
		s.Dockerd = Process(daemon)
	}
	s.Containerd = ProcessesNamed("containerd")
	for _, id := range ids {
		s.Containers += Container(id)
	}
	return s
}

// Minus is s less an earlier sample.
func (s Sample) Minus(before Sample) Sample {
	return Sample{
		Self:       s.Self - before.Self,
		Process:    s.Process - before.Process,
		Dockerd:    s.Dockerd - before.Dockerd,
		Containerd: s.Containerd - before.Containerd,
		Containers: s.Containers - before.Containers,
		Machine:    s.Machine - before.Machine,
	}
}

// Per divides every figure by n operations (n > 0).
func (s Sample) Per(n int) Sample {
	d := time.Duration(n)
	return Sample{s.Self / d, s.Process / d, s.Dockerd / d, s.Containerd / d, s.Containers / d, s.Machine / d}
}

// Named is the sum of every figure but Machine: the CPU the processes a
// benchmark names used, which other work on a shared machine affects less
// than Machine.
func (s Sample) Named() time.Duration {
	return s.Self + s.Process + s.Dockerd + s.Containerd + s.Containers
}

// String is every figure in microseconds, Process only when it is not zero.
func (s Sample) String() string {
	us := func(d time.Duration) int64 { return d.Microseconds() }
	var b strings.Builder
	fmt.Fprintf(&b, "self %d", us(s.Self))
	if s.Process != 0 {
		fmt.Fprintf(&b, ", process %d", us(s.Process))
	}
	fmt.Fprintf(&b, ", dockerd %d, containerd+shims %d, containers %d: named %d; machine %d",
		us(s.Dockerd), us(s.Containerd), us(s.Containers), us(s.Named()), us(s.Machine))
	return b.String()
}

// Self is this process's user and system time.
func Self() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is the unit of /proc's CPU times: USER_HZ, 100 on Linux.
const clockTick = time.Second / 100

// Process is the user and system time of process pid, 0 if unknown.
func Process(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command may contain spaces; fields count from after its ')'.
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(fields[11], 10, 64)
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(ut+st) * clockTick
}

// ProcessesNamed is the summed time of every process whose command name
// starts with prefix.
func ProcessesNamed(prefix string) time.Duration {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var total time.Duration
	for _, dir := range dirs {
		comm, err := os.ReadFile(dir + "/comm")
		if err != nil || !strings.HasPrefix(string(comm), prefix) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(dir))
		total += Process(pid)
	}
	return total
}

// Container is the CPU time of the Docker container with the full ID id:
// cgroup v1's cpuacct.usage, else cgroup v2's cpu.stat, under the
// cgroupfs or the systemd driver's path; 0 if none is found.
func Container(id string) time.Duration {
	if raw, err := os.ReadFile("/sys/fs/cgroup/cpuacct/docker/" + id + "/cpuacct.usage"); err == nil {
		ns, _ := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		return time.Duration(ns)
	}
	for _, p := range []string{"/sys/fs/cgroup/system.slice/docker-" + id + ".scope/cpu.stat", "/sys/fs/cgroup/docker/" + id + "/cpu.stat"} {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, _ := strconv.ParseInt(v, 10, 64)
				return time.Duration(us) * time.Microsecond
			}
		}
	}
	return 0
}

// Machine is the busy time of all CPUs: /proc/stat's first line's user,
// nice, system, irq and softirq (not idle, iowait, or steal, which is
// another guest's; guest time is inside user time already).
func Machine() time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	fields := strings.Fields(line)
	if len(fields) < 8 || fields[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		v, _ := strconv.ParseInt(fields[i], 10, 64)
		busy += v
	}
	return time.Duration(busy) * clockTick
}
