package nodeproto

import (
	"math"
	"strings"
	"testing"
)

// honest is a plausible machine: within every bound.
func honest() NodeFacts {
	return NodeFacts{Hostname: "gpu-01", OS: "linux", Arch: "amd64", CPUs: 96, MemoryBytes: 1 << 40, DiskFreeBytes: 2 << 40, CapabilityVersion: Version,
		Accelerators: []Accelerator{{Vendor: "nvidia", Model: "NVIDIA H100 80GB HBM3", UUID: "GPU-0a1b2c3d-0000-1111-2222-333344445555", MemoryBytes: 81559 << 20}},
		Link:         &LinkReading{BytesPerSecond: 2 << 30, Confidence: 0.9, Bytes: 1 << 30},
		Functions:    &FunctionCapacity{MemoryBytes: 8 << 30, MilliCPUs: 4000}}
}

func TestCheckFacts(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(f *NodeFacts)
		wants []string // substrings of the problems, in order; none: accepted
	}{
		{"honest machine", func(f *NodeFacts) {}, nil},
		{"nothing measured", func(f *NodeFacts) { *f = NodeFacts{} }, nil},
		{"100,000 CPUs", func(f *NodeFacts) { f.CPUs = 100000 }, []string{"cpus: 100000 is above the maximum of 4096"}},
		{"negative CPUs", func(f *NodeFacts) { f.CPUs = -4 }, []string{"cpus: -4 is negative"}},
		{"NaN CPUs", func(f *NodeFacts) { f.CPUs = math.NaN() }, []string{"cpus: NaN is not a number"}},
		{"infinite CPUs", func(f *NodeFacts) { f.CPUs = math.Inf(1) }, []string{"cpus: +Inf is not a number"}},
		{"1 PiB of memory", func(f *NodeFacts) { f.MemoryBytes = 1 << 50 }, []string{"memory_bytes: 1125899906842624 is above the maximum"}},
		{"negative memory", func(f *NodeFacts) { f.MemoryBytes = -1 }, []string{"memory_bytes: -1 is negative"}},
		{"negative disk", func(f *NodeFacts) { f.DiskFreeBytes = -1 }, []string{"disk_free_bytes: -1 is negative"}},
		{"65 GPUs", func(f *NodeFacts) { f.Accelerators = make([]Accelerator, 65) }, []string{"accelerators: 65 entries, above the maximum of 64"}},
		{"2 TiB GPU", func(f *NodeFacts) { f.Accelerators[0].MemoryBytes = 2 << 40 }, []string{"accelerators[0].memory_bytes: 2199023255552 is above"}},
		{"negative GPU memory", func(f *NodeFacts) { f.Accelerators[0].MemoryBytes = -5 }, []string{"accelerators[0].memory_bytes: -5 is negative"}},
		{"huge hostname", func(f *NodeFacts) { f.Hostname = strings.Repeat("h", MaxFactStringBytes+1) }, []string{"hostname: 4097 bytes"}},
		{"huge UUID", func(f *NodeFacts) { f.Accelerators[0].UUID = strings.Repeat("u", MaxFactStringBytes+1) }, []string{"accelerators[0].uuid: 4097 bytes"}},
		{"link confidence above 1", func(f *NodeFacts) { f.Link.Confidence = 1.5 }, []string{"link.confidence: 1.5 is above the maximum of 1"}},
		{"negative link rate", func(f *NodeFacts) { f.Link.BytesPerSecond = -1 }, []string{"link.bytes_per_second: -1 is negative"}},
		{"negative artifact", func(f *NodeFacts) { f.Artifacts = []HeldArtifact{{SHA256: "x", Size: -1}} }, []string{"artifacts[0].size: -1 is negative"}},
		{"function share above the machine bound", func(f *NodeFacts) { f.Functions.MilliCPUs = (MaxFactCPUs + 1) * 1000 }, []string{"functions.milli_cpus"}},
		{"negative container count", func(f *NodeFacts) { f.Functions.Containers = []FunctionContainers{{FnID: "f", Busy: -1}} }, []string{"functions.containers[0].busy: -1 is negative"}},
		{"negative capability", func(f *NodeFacts) { f.CapabilityVersion = -1 }, []string{"capability_version: -1 is negative"}},
		{"too many notes", func(f *NodeFacts) { f.Notes = make([]string, MaxFactNotes+1) }, []string{"notes: 257 entries"}},
		{"several at once, in field order", func(f *NodeFacts) { f.CPUs, f.MemoryBytes = -1, 1<<50 }, []string{"cpus:", "memory_bytes:"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := honest()
			tc.edit(&f)
			got := CheckFacts(&f)
			if len(got) != len(tc.wants) {
				t.Fatalf("problems = %q, want %d matching %q", got, len(tc.wants), tc.wants)
			}
			for i, want := range tc.wants {
				if !strings.Contains(got[i], want) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], want)
				}
			}
		})
	}
}

// TestCheckFactsBoundsItsAnswer: a node sending a million bad figures gets
// a short answer, not a million lines stored on its record.
func TestCheckFactsBoundsItsAnswer(t *testing.T) {
	f := honest()
	f.Images = make([]string, 1000)
	for i := range f.Images {
		f.Images[i] = strings.Repeat("x", MaxFactStringBytes+1)
	}
	if got := CheckFacts(&f); len(got) != maxFactProblems {
		t.Fatalf("%d problems, want the cap of %d", len(got), maxFactProblems)
	}
}
