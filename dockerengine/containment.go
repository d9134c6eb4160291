package dockerengine

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/docker/docker/api/types/container"
)

// DroppedCapabilities are taken out of Docker's default capability set for
// every workload container, a Run's or a function's. Each is something a
// batch job or a function almost never needs and an attacker inside a
// container often does (docs/hardening.md, "Contained workloads", says the
// same in a table):
//
//   - NET_RAW: raw and packet sockets, the tool of ARP and DNS spoofing
//     against the other containers on the bridge. ping still works: Docker
//     opens ICMP echo sockets to every group in a container.
//   - MKNOD: creating device nodes. The cgroup device rules already deny
//     using them; no workload needs to make one.
//   - AUDIT_WRITE: writing to the host kernel's audit log, which only
//     login programs (sshd, su) do.
//   - SETFCAP: giving files capabilities, a step of the user-namespace
//     escapes; package installs fall back to setuid bits without it.
//   - SETPCAP: moving capabilities between processes' bounding and
//     inheritable sets, which no workload that is not a container runtime
//     does.
//   - SYS_CHROOT: chroot, needed only by build tools that assemble a root
//     filesystem, and a step of several breakouts.
//
// Kept: CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID and
// NET_BIND_SERVICE, because images routinely install packages or drop to an
// unprivileged user at start (gosu, su-exec), and the no-new-privileges
// option already stops such a switch from ever gaining privileges back.
var DroppedCapabilities = []string{"AUDIT_WRITE", "MKNOD", "NET_RAW", "SETFCAP", "SETPCAP", "SYS_CHROOT"}

// NoNewPrivileges is the security option that stops a container's
// processes from gaining privileges through setuid or file-capability
// binaries (the kernel's PR_SET_NO_NEW_PRIVS).
const NoNewPrivileges = "no-new-privileges"

// LogFiles is how many files a Run container's json-file log is split
// into: the daemon drops the oldest file when the newest is full, so a
// quarter of the kept output goes at a time rather than all of it.
const LogFiles = 4

// Containment is what a node holds its workload containers to beyond what
// a spec asks for: the limits a container gets when its spec states none,
// the process limit, and how much of a Run's output the daemon keeps. The
// capability drop and no-new-privileges are not configurable: every
// container gets them (Apply).
//
// A zero field means none: no default CPU quota, no default memory limit,
// and so on; DefaultContainment is what an agent runs with unless its
// operator says otherwise. Check says whether a Containment is usable.
type Containment struct {
	// DefaultCPU is the CPU quota, in cores, of a container whose spec
	// states none.
	DefaultCPU float64
	// DefaultMemoryBytes is the hard memory limit (swap included) of a
	// container whose spec states none.
	DefaultMemoryBytes int64
	// PidsLimit is the most processes and threads a container may have at
	// once, unless its spec asks for another number (up to MaxPidsLimit).
	// It stops a fork bomb from taking the machine's process table.
	PidsLimit int64
	// MaxPidsLimit is the most a spec may ask for.
	MaxPidsLimit int64
	// LogMaxBytes is the most of a Run container's output the daemon keeps
	// on the node's disk (json-file, in LogFiles files). Function
	// containers keep none: the function engine reads their output from
	// the attach stream.
	LogMaxBytes int64
}

// DefaultContainment is an agent's Containment unless its operator states
// another: a core and 2 GiB for a container whose spec states neither (a
// job that needs more says so, and is then also counted by the scheduler),
// 4,096 processes (a large build's make -j stays well under it), at most
// 65,536 on request, and 256 MiB of output kept per Run container, more
// than the control plane keeps of one attempt, so what it would keep is
// still on the node when an agent resends after a partition.
func DefaultContainment() Containment {
	return Containment{
		DefaultCPU:         1,
		DefaultMemoryBytes: 2 << 30,
		PidsLimit:          4096,
		MaxPidsLimit:       65536,
		LogMaxBytes:        256 << 20,
	}
}

// minLogBytes is the smallest output a Run container may keep: less would
// rotate away a log before the agent has read it.
const minLogBytes = 1 << 20

// Check returns an error naming the first field of c that cannot be
// applied, or nil. A process limit is required: a container without one is
// exactly what containment exists to prevent.
func (c Containment) Check() error {
	switch {
	case c.DefaultCPU < 0 || c.DefaultCPU != c.DefaultCPU:
		return fmt.Errorf("default CPU %v is not a number of cores (0 for no default quota)", c.DefaultCPU)
	case c.DefaultMemoryBytes < 0 || (c.DefaultMemoryBytes > 0 && c.DefaultMemoryBytes < 6<<20):
		return fmt.Errorf("default memory %d bytes must be 0 (no default limit) or at least 6 MiB, Docker's minimum", c.DefaultMemoryBytes)
	case c.PidsLimit <= 0:
		return fmt.Errorf("pids limit %d must be positive: every container gets one", c.PidsLimit)
	case c.MaxPidsLimit < c.PidsLimit:
		return fmt.Errorf("maximum pids limit %d is below the default %d", c.MaxPidsLimit, c.PidsLimit)
	case c.LogMaxBytes < minLogBytes:
		return fmt.Errorf("log size %d bytes must be at least 1 MiB", c.LogMaxBytes)
	}
	return nil
}

// Apply sets on hc what every workload container gets whatever its spec
// says: Docker's default capabilities less DroppedCapabilities, the
// no-new-privileges option, never privileged mode, and pids as its process
// limit (c.PidsLimit when pids is 0). It replaces those fields, so a
// caller cannot have widened them before.
func (c Containment) Apply(hc *container.HostConfig, pids int64) {
	if pids <= 0 {
		pids = c.PidsLimit
	}
	hc.Privileged = false
	hc.CapAdd = nil
	hc.CapDrop = slices.Clone(DroppedCapabilities)
	hc.SecurityOpt = []string{NoNewPrivileges}
	hc.PidsLimit = &pids
}

// RunLogConfig is the log driver of a Run container: json-file, which the
// agent reads back through the Engine API's logs call, rotated so that at
// most c.LogMaxBytes stay on the node's disk.
func (c Containment) RunLogConfig() container.LogConfig {
	return container.LogConfig{Type: "json-file", Config: map[string]string{
		"max-size": strconv.FormatInt(max(c.LogMaxBytes/LogFiles, 1), 10),
		"max-file": strconv.Itoa(LogFiles),
	}}
}
