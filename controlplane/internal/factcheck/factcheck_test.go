package factcheck

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

const (
	uuidA   = "GPU-aaaaaaaa-0000-1111-2222-333344445555"
	uuidB   = "GPU-bbbbbbbb-0000-1111-2222-333344445555"
	uuidDup = "GPU-dddddddd-0000-1111-2222-333344445555"
)

func h100(uuid string) nodeproto.Accelerator {
	return nodeproto.Accelerator{Vendor: "nvidia", Model: "NVIDIA H100 80GB HBM3", UUID: uuid, MemoryBytes: 81559 << 20}
}

func kinds(flags []api.NodeFlag) []string {
	var out []string
	for _, f := range flags {
		out = append(out, f.Kind)
	}
	return out
}

// TestJudgeFacts holds the pure checks to what each finding is: a refusal
// or a warning, and of which kind.
func TestJudgeFacts(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	machine := func() *nodeproto.NodeFacts {
		return &nodeproto.NodeFacts{Hostname: "gpu-01", CPUs: 64, MemoryBytes: 512 << 30, Accelerators: []nodeproto.Accelerator{h100(uuidA), h100(uuidB)},
			Functions: &nodeproto.FunctionCapacity{MemoryBytes: 8 << 30, MilliCPUs: 4000, GPUs: []string{uuidB}}}
	}
	cases := []struct {
		name    string
		prev    func(f *nodeproto.NodeFacts) // nil: no previous report
		edit    func(f *nodeproto.NodeFacts)
		refused string   // a substring of the refusal; "" when applied
		flags   []string // kinds, in order
		gpus    int      // accelerators kept when applied
	}{
		{name: "an honest machine", edit: func(f *nodeproto.NodeFacts) {}, gpus: 2},
		{name: "100,000 CPUs", edit: func(f *nodeproto.NodeFacts) { f.CPUs = 100000 }, refused: "cpus: 100000 is above", flags: []string{api.NodeFlagFactsRefused}},
		{name: "negative CPUs", edit: func(f *nodeproto.NodeFacts) { f.CPUs = -1 }, refused: "cpus: -1 is negative", flags: []string{api.NodeFlagFactsRefused}},
		{name: "NaN CPUs", edit: func(f *nodeproto.NodeFacts) { f.CPUs = math.NaN() }, refused: "not a number", flags: []string{api.NodeFlagFactsRefused}},
		{name: "1 PiB of memory", edit: func(f *nodeproto.NodeFacts) { f.MemoryBytes = 1 << 50 }, refused: "memory_bytes", flags: []string{api.NodeFlagFactsRefused}},
		{name: "one UUID four times", edit: func(f *nodeproto.NodeFacts) {
			f.Accelerators = []nodeproto.Accelerator{h100(uuidDup), h100(uuidDup), h100(uuidDup), h100(uuidDup)}
			f.Functions.GPUs = nil
		}, flags: []string{api.NodeFlagGPUDuplicate}, gpus: 1},
		{name: "a UUID not in nvidia-smi's format", edit: func(f *nodeproto.NodeFacts) { f.Accelerators[0].UUID = "GPU-dup" }, flags: []string{api.NodeFlagGPUUUIDFormat}, gpus: 2},
		{name: "another vendor's UUID is not judged", edit: func(f *nodeproto.NodeFacts) { f.Accelerators[0].Vendor, f.Accelerators[0].UUID = "amd", "0x1234" }, gpus: 2},
		{name: "an 80GB model with 8 GB", edit: func(f *nodeproto.NodeFacts) { f.Accelerators[0].MemoryBytes = 8 << 30 },
			flags: []string{api.NodeFlagGPUMemory, api.NodeFlagGPUMemory}, gpus: 2}, // unlike its name, and unlike its twin (and the twin unlike it)
		{name: "twins of one model disagree", edit: func(f *nodeproto.NodeFacts) {
			f.Accelerators[0].Model, f.Accelerators[1].Model = "Tesla T4", "Tesla T4"
			f.Accelerators[1].MemoryBytes *= 2
		}, flags: []string{api.NodeFlagGPUMemory, api.NodeFlagGPUMemory}, gpus: 2},
		{name: "unknown GPU memory is not judged", edit: func(f *nodeproto.NodeFacts) { f.Accelerators[0].MemoryBytes = 0 }, gpus: 2},
		{name: "function share larger than the machine", edit: func(f *nodeproto.NodeFacts) {
			f.Functions.MemoryBytes, f.Functions.MilliCPUs, f.Functions.GPUs = 1<<40, 128000, []string{"GPU-elsewhere"}
		}, flags: []string{api.NodeFlagShareAboveTotal, api.NodeFlagShareAboveTotal, api.NodeFlagShareAboveTotal}, gpus: 2},
		{name: "memory tripled since the last report", prev: func(f *nodeproto.NodeFacts) { f.MemoryBytes /= 3 }, edit: func(f *nodeproto.NodeFacts) {},
			flags: []string{api.NodeFlagFactsJump}, gpus: 2},
		{name: "GPUs and hostname changed", prev: func(f *nodeproto.NodeFacts) { f.Accelerators = f.Accelerators[:1]; f.Hostname = "other" },
			edit: func(f *nodeproto.NodeFacts) {}, flags: []string{api.NodeFlagFactsJump, api.NodeFlagFactsJump}, gpus: 2},
		{name: "small drift is no jump", prev: func(f *nodeproto.NodeFacts) { f.MemoryBytes -= 1 << 30; f.CPUs = 48 }, edit: func(f *nodeproto.NodeFacts) {}, gpus: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var prev *nodeproto.NodeFacts
			if tc.prev != nil {
				prev = machine()
				tc.prev(prev)
			}
			f := machine()
			tc.edit(f)
			j := Judge(prev, f, now)
			if got := strings.Join(kinds(j.Flags), ","); got != strings.Join(tc.flags, ",") {
				t.Fatalf("flags %s, want %s: %+v", got, strings.Join(tc.flags, ","), j.Flags)
			}
			if tc.refused != "" {
				if j.Facts != nil || !strings.Contains(j.Refusal, tc.refused) || !strings.Contains(j.Flags[0].Detail, tc.refused) {
					t.Fatalf("refusal %q (facts kept: %v), want one naming %q", j.Refusal, j.Facts != nil, tc.refused)
				}
				return
			}
			if j.Facts == nil || len(j.Facts.Accelerators) != tc.gpus {
				t.Fatalf("applied facts %+v, want %d GPUs", j.Facts, tc.gpus)
			}
			for _, fl := range j.Flags {
				if fl.Detail == "" || !fl.Since.Equal(now) {
					t.Errorf("flag %+v lacks its detail or time", fl)
				}
			}
		})
	}
}
