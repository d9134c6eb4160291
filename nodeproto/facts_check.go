package nodeproto

import (
	"fmt"
	"math"
)

// Bounds on what a node may report about itself. A control plane refuses
// a NodeFacts outside them (CheckFacts) rather than believing it: a node
// that claimed 100,000 CPUs and a pebibyte of memory once received every
// Run in the fleet. Each bound is a sane maximum for one machine today,
// with room to spare, not a measure of any real machine; raising one is a
// protocol change made here, on both sides at once.
const (
	// MaxFactCPUs is the most CPUs one node may report. The largest
	// single-system-image machines sold today have under 2,000 hardware
	// threads.
	MaxFactCPUs = 4096
	// MaxFactMemoryBytes (64 TiB) bounds the memory one node may report,
	// and the memory set aside for functions. The largest x86 machines
	// take 32 TiB.
	MaxFactMemoryBytes = 64 << 40
	// MaxFactDiskBytes (16 PiB) bounds the free disk a node reports and the
	// size of any Artifact it holds. It is generous because the Docker
	// data root may sit on a network filesystem.
	MaxFactDiskBytes = 16 << 50
	// MaxFactGPUs is the most accelerators one node may list (machines sold
	// today hold at most 16; 64 leaves room for partitioned devices).
	MaxFactGPUs = 64
	// MaxFactGPUMemoryBytes (1 TiB) bounds one accelerator's memory; the
	// largest device sold today has under 300 GB.
	MaxFactGPUMemoryBytes = 1 << 40
	// MaxFactLinkBPS (1 TB/s) bounds a measured artifact-copy rate.
	MaxFactLinkBPS = 1_000_000_000_000
	// MaxFactList bounds each list in the facts (images, Artifacts and
	// their references, function containers) and each container count:
	// the inventory of one machine, not of a registry.
	MaxFactList = 65536
	// MaxFactLabels bounds the node's labels (as api.MaxLabels does an
	// operator's).
	MaxFactLabels = 32
	// MaxFactNotes bounds the notes, and MaxFactStringBytes the length of
	// every string in the facts (a note included).
	MaxFactNotes       = 256
	MaxFactStringBytes = 4096
	// MaxFactCapabilityVersion bounds the capability version a node
	// states; versions are small integers raised one at a time.
	MaxFactCapabilityVersion = 1 << 16
	// maxFactProblems bounds what CheckFacts lists, so a refusal's reason
	// stays small whatever the node sent.
	maxFactProblems = 16
)

// CheckFacts returns what is out of bounds in f, one problem per field,
// each naming the field, the value and the bound (at most 16 problems; an
// empty list means f is within bounds). Zero is always allowed: it means
// the node could not measure that figure (see NodeFacts). It checks bounds
// only; whether the figures agree with each other is the control plane's
// business (package controlplane/internal/factcheck).
func CheckFacts(f *NodeFacts) []string {
	c := &factChecker{}
	c.float("cpus", f.CPUs, MaxFactCPUs)
	c.int("memory_bytes", f.MemoryBytes, MaxFactMemoryBytes)
	c.int("disk_free_bytes", f.DiskFreeBytes, MaxFactDiskBytes)
	c.int("capability_version", int64(f.CapabilityVersion), MaxFactCapabilityVersion)
	for _, s := range []struct{ name, v string }{{"hostname", f.Hostname}, {"os", f.OS}, {"arch", f.Arch}, {"runtime_name", f.RuntimeName},
		{"runtime_version", f.RuntimeVersion}, {"runtime_api_version", f.RuntimeAPIVersion}, {"agent_version", f.AgentVersion}} {
		c.str(s.name, s.v)
	}
	c.list("images", len(f.Images), MaxFactList)
	for i, img := range f.Images {
		c.str(fmt.Sprintf("images[%d]", i), img)
	}
	c.list("labels", len(f.Labels), MaxFactLabels)
	for k, v := range f.Labels {
		c.str("labels["+k+"]", k+v)
	}
	c.list("accelerators", len(f.Accelerators), MaxFactGPUs)
	for i, a := range f.Accelerators {
		at := fmt.Sprintf("accelerators[%d].", i)
		c.int(at+"memory_bytes", a.MemoryBytes, MaxFactGPUMemoryBytes)
		for _, s := range []struct{ name, v string }{{"vendor", a.Vendor}, {"model", a.Model}, {"uuid", a.UUID},
			{"driver_version", a.DriverVersion}, {"cuda_version", a.CUDAVersion}, {"pci_bus_id", a.PCIBusID}} {
			c.str(at+s.name, s.v)
		}
	}
	c.list("gpu_health", len(f.GPUHealth), MaxFactGPUs)
	for i, h := range f.GPUHealth {
		at := fmt.Sprintf("gpu_health[%d].", i)
		c.list(at+"xids", len(h.XIDs), MaxGPUXids)
		for _, s := range []struct{ name, v string }{{"uuid", h.UUID}, {"state", h.State}, {"reason", h.Reason}, {"detail", h.Detail}} {
			c.str(at+s.name, s.v)
		}
		for j, x := range h.XIDs {
			c.str(fmt.Sprintf("%sxids[%d].detail", at, j), x.Detail)
		}
	}
	c.list("artifacts", len(f.Artifacts), MaxFactList)
	for i, h := range f.Artifacts {
		c.int(fmt.Sprintf("artifacts[%d].size", i), h.Size, MaxFactDiskBytes)
		c.list(fmt.Sprintf("artifacts[%d].refs", i), len(h.Refs), MaxFactList)
	}
	if l := f.Link; l != nil {
		c.int("link.bytes_per_second", l.BytesPerSecond, MaxFactLinkBPS)
		c.int("link.bytes", l.Bytes, MaxFactDiskBytes)
		c.float("link.confidence", l.Confidence, 1)
	}
	if fc := f.Functions; fc != nil {
		c.int("functions.memory_bytes", fc.MemoryBytes, MaxFactMemoryBytes)
		c.int("functions.milli_cpus", fc.MilliCPUs, MaxFactCPUs*1000)
		c.list("functions.gpus", len(fc.GPUs), MaxFactGPUs)
		c.list("functions.containers", len(fc.Containers), MaxFactList)
		for i, n := range fc.Containers {
			at := fmt.Sprintf("functions.containers[%d].", i)
			for _, v := range []struct {
				name string
				n    int
			}{{"idle", n.Idle}, {"paused", n.Paused}, {"busy", n.Busy}, {"starting", n.Starting}} {
				c.int(at+v.name, int64(v.n), MaxFactList)
			}
		}
	}
	c.list("notes", len(f.Notes), MaxFactNotes)
	for i, n := range f.Notes {
		c.str(fmt.Sprintf("notes[%d]", i), n)
	}
	return c.problems
}

// factChecker collects CheckFacts's problems, at most maxFactProblems.
type factChecker struct{ problems []string }

func (c *factChecker) add(format string, args ...any) {
	if len(c.problems) < maxFactProblems {
		c.problems = append(c.problems, fmt.Sprintf(format, args...))
	}
}

func (c *factChecker) float(name string, v, max float64) {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		c.add("%s: %v is not a number", name, v)
	case v < 0:
		c.add("%s: %g is negative", name, v)
	case v > max:
		c.add("%s: %g is above the maximum of %g a node may report", name, v, max)
	}
}

func (c *factChecker) int(name string, v, max int64) {
	switch {
	case v < 0:
		c.add("%s: %d is negative", name, v)
	case v > max:
		c.add("%s: %d is above the maximum of %d a node may report", name, v, max)
	}
}

func (c *factChecker) list(name string, n, max int) {
	if n > max {
		c.add("%s: %d entries, above the maximum of %d", name, n, max)
	}
}

func (c *factChecker) str(name, v string) {
	if len(v) > MaxFactStringBytes {
		c.add("%s: %d bytes, above the maximum of %d", name, len(v), MaxFactStringBytes)
	}
}
