// Package factcheck checks a node's facts before the control plane believes
// them. A node's facts are its own word about itself, and the scheduler
// places work on them: a node that claimed 100,000 CPUs received every Run,
// and two nodes naming one GPU had a run placed on that GPU four times.
// What is checked, what is done about each finding and what cannot be
// checked are in docs/hardening.md ("Node facts"); in short:
//
//   - A report outside the bounds of nodeproto.CheckFacts is refused: it is
//     not applied, the node is flagged facts_refused with the reasons, and
//     it takes no new work until a report within bounds arrives.
//   - A GPU UUID listed twice by one node is counted once (gpu_duplicate).
//   - A GPU UUID another enrolled node also claims is disputed on both
//     (gpu_disputed): neither gets work on it until an operator clears the
//     dispute (Clear). Disputes outlive reports; every other flag is
//     replaced by the next report.
//   - A GPU the node reports sick is quarantined (gpu_unhealthy), and one an
//     operator cordons is withheld (gpu_cordoned): like disputes, both
//     outlive reports until an operator uncordons the GPU (gpuhealth.go).
//   - Figures that contradict each other are warnings: a GPU UUID not in
//     its vendor's format, a GPU's memory unlike the size its model name
//     states or unlike its twins', a function share larger than the
//     machine, figures that jumped between two reports.
//
// Judge is pure; Apply applies a report to the store. Only package
// controlplane imports it.
package factcheck

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

// factJump is the factor by which CPUs or memory may change between two
// reports before the change is flagged: a machine's hardware does not
// double or halve between reports, a lie or a bug may.
const factJump = 2

// nvidiaUUID is what nvidia-smi prints for a whole GPU ("GPU-" and a UUID)
// or a MIG instance ("MIG-" and a UUID); package hostfacts lists only the
// former, so anything else from an "nvidia" accelerator was not read from
// the vendor tool by Mercator's agent.
var nvidiaUUID = regexp.MustCompile(`^(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// statedGB finds a memory size stated in a GPU's model name, as NVIDIA
// names them ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB").
var statedGB = regexp.MustCompile(`(?i)(\d{1,4})\s*GB\b`)

// Judged is what one report comes to: the facts to store (GPU duplicates
// removed), or nil and the Refusal when the report is refused; and the
// flags the report raises.
type Judged struct {
	Facts   *nodeproto.NodeFacts
	Flags   []api.NodeFlag
	Refusal string
}

// Judge checks one report against the bounds, against itself and against
// the node's previous report (prev, nil for a first report). The
// fleet-wide GPU check needs the store and is Apply's.
func Judge(prev, f *nodeproto.NodeFacts, now time.Time) Judged {
	flag := func(kind, gpu, format string, args ...any) api.NodeFlag {
		return api.NodeFlag{Kind: kind, GPU: gpu, Detail: fmt.Sprintf(format, args...), Since: now}
	}
	if problems := nodeproto.CheckFacts(f); len(problems) > 0 {
		reason := "facts refused, not applied (the node takes no new work until it reports facts within bounds): " + strings.Join(problems, "; ")
		return Judged{Refusal: reason, Flags: []api.NodeFlag{flag(api.NodeFlagFactsRefused, "", "%s", reason)}}
	}
	kept := *f
	var flags []api.NodeFlag
	// One UUID listed several times is one device: counted once.
	kept.Accelerators = nil
	seen := map[string]int{}
	for _, a := range f.Accelerators {
		if seen[a.UUID]++; seen[a.UUID] == 1 {
			kept.Accelerators = append(kept.Accelerators, a)
		}
	}
	for _, a := range kept.Accelerators {
		if n := seen[a.UUID]; n > 1 {
			flags = append(flags, flag(api.NodeFlagGPUDuplicate, a.UUID, "GPU %q is listed %d times; it is counted once", a.UUID, n))
		}
		if strings.EqualFold(a.Vendor, "nvidia") && !nvidiaUUID.MatchString(a.UUID) {
			flags = append(flags, flag(api.NodeFlagGPUUUIDFormat, a.UUID, "GPU %q is not in the format nvidia-smi reports (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", a.UUID))
		}
		if detail := gpuMemoryMismatch(a, kept.Accelerators); detail != "" {
			flags = append(flags, flag(api.NodeFlagGPUMemory, a.UUID, "%s", detail))
		}
	}
	for _, detail := range shareAboveCapacity(&kept) {
		flags = append(flags, flag(api.NodeFlagShareAboveTotal, "", "%s", detail))
	}
	if prev != nil {
		for _, detail := range factJumps(prev, &kept) {
			flags = append(flags, flag(api.NodeFlagFactsJump, "", "%s", detail))
		}
	}
	return Judged{Facts: &kept, Flags: flags}
}

// gpuMemoryMismatch says how a's memory contradicts its model name (which
// may state a size in GB: between 0.9 GB and 1.1 GiB per stated GB is
// accepted, the spread between what vendors print and what the tool
// counts) or the other GPUs of the same model on the node (which must
// agree within 5%); "" when it does not, or when the memory is unknown.
func gpuMemoryMismatch(a nodeproto.Accelerator, all []nodeproto.Accelerator) string {
	if a.MemoryBytes <= 0 {
		return ""
	}
	if m := statedGB.FindStringSubmatch(a.Model); m != nil {
		gb, _ := strconv.ParseFloat(m[1], 64)
		if mem := float64(a.MemoryBytes); mem < 0.9*gb*1e9 || mem > 1.1*gb*(1<<30) {
			return fmt.Sprintf("GPU %q (%s) reports %d bytes of memory, unlike the %s GB its model states", a.UUID, a.Model, a.MemoryBytes, m[1])
		}
	}
	for _, b := range all {
		if b.Model == a.Model && b.MemoryBytes > 0 && math.Abs(float64(b.MemoryBytes-a.MemoryBytes)) > 0.05*float64(max(a.MemoryBytes, b.MemoryBytes)) {
			return fmt.Sprintf("GPU %q reports %d bytes of memory and GPU %q of the same model (%s) %d", a.UUID, a.MemoryBytes, b.UUID, a.Model, b.MemoryBytes)
		}
	}
	return ""
}

// shareAboveCapacity says where the function share (allocatable) exceeds
// the machine (capacity), or names a GPU the machine does not list.
func shareAboveCapacity(f *nodeproto.NodeFacts) []string {
	fc := f.Functions
	if fc == nil {
		return nil
	}
	var out []string
	if f.MemoryBytes > 0 && fc.MemoryBytes > f.MemoryBytes {
		out = append(out, fmt.Sprintf("the function share has %d bytes of memory, more than the machine's %d", fc.MemoryBytes, f.MemoryBytes))
	}
	if f.CPUs > 0 && float64(fc.MilliCPUs) > f.CPUs*1000 {
		out = append(out, fmt.Sprintf("the function share has %d milli-CPUs, more than the machine's %g CPUs", fc.MilliCPUs, f.CPUs))
	}
	for _, g := range fc.GPUs {
		if !slices.ContainsFunc(f.Accelerators, func(a nodeproto.Accelerator) bool { return a.UUID == g }) {
			out = append(out, fmt.Sprintf("the function share names GPU %q, which the machine does not list", g))
		}
	}
	return out
}

// factJumps says which figures changed wildly since the previous report:
// CPUs or memory by more than factJump either way, the GPUs' number, the
// hostname.
func factJumps(prev, f *nodeproto.NodeFacts) []string {
	var out []string
	jumped := func(a, b float64) bool { return a > 0 && b > 0 && (a > b*factJump || b > a*factJump) }
	if jumped(prev.CPUs, f.CPUs) {
		out = append(out, fmt.Sprintf("CPUs changed from %g to %g between two reports", prev.CPUs, f.CPUs))
	}
	if jumped(float64(prev.MemoryBytes), float64(f.MemoryBytes)) {
		out = append(out, fmt.Sprintf("memory changed from %d to %d bytes between two reports", prev.MemoryBytes, f.MemoryBytes))
	}
	if len(prev.Accelerators) != len(f.Accelerators) {
		out = append(out, fmt.Sprintf("GPUs changed from %d to %d between two reports", len(prev.Accelerators), len(f.Accelerators)))
	}
	if prev.Hostname != "" && f.Hostname != prev.Hostname {
		out = append(out, fmt.Sprintf("hostname changed from %q to %q between two reports", prev.Hostname, f.Hostname))
	}
	return out
}
