package controlplane

import (
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Node facts are checked before they are believed. A node's facts are its
// own word about itself, and the scheduler places work on them: a node that
// claimed 100,000 CPUs received every Run, and two nodes naming the same
// GPU had one run placed on that GPU four times. What the control plane
// checks, what it does about each finding, and what it cannot check are
// in docs/hardening.md ("Node facts"); in short:
//
//   - A report outside the bounds of nodeproto.CheckFacts is refused: it is
//     acknowledged (so the agent's spool drains and its other events are
//     not held behind it) but not applied, the node is flagged
//     facts_refused with the reasons, and it takes no new work until a
//     report within bounds arrives.
//   - A GPU UUID listed twice by one node is counted once (gpu_duplicate).
//   - A GPU UUID another enrolled node also claims is disputed on both
//     (gpu_disputed): neither gets work on it until an operator clears the
//     dispute (clearGPUDispute). Disputes outlive reports; every other flag
//     is replaced by the next report.
//   - Figures that contradict each other are warnings: a GPU UUID not in
//     its vendor's format, a GPU's memory unlike the size its model name
//     states or unlike its twins', a function share larger than the
//     machine, figures that jumped between two reports.
//
// Every flag raised is counted (mercator_node_fact_flags_total, by kind)
// and logged.

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

// judgedFacts is what intake makes of one report: the facts to store (GPU
// duplicates removed) unless refused, and the flags the report raises.
type judgedFacts struct {
	facts   *nodeproto.NodeFacts // nil: refused
	flags   []api.NodeFlag
	refusal string
}

// judgeFacts checks one report against the bounds and against itself and
// the node's previous report (prev, nil for a first report). It is pure:
// the fleet-wide GPU check needs the store and is done by applyFacts.
func judgeFacts(prev, f *nodeproto.NodeFacts, now time.Time) judgedFacts {
	flag := func(kind, gpu, format string, args ...any) api.NodeFlag {
		return api.NodeFlag{Kind: kind, GPU: gpu, Detail: fmt.Sprintf(format, args...), Since: now}
	}
	if problems := nodeproto.CheckFacts(f); len(problems) > 0 {
		reason := "facts refused, not applied (the node takes no new work until it reports facts within bounds): " + strings.Join(problems, "; ")
		return judgedFacts{refusal: reason, flags: []api.NodeFlag{flag(api.NodeFlagFactsRefused, "", "%s", reason)}}
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
	return judgedFacts{facts: &kept, flags: flags}
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
		lo, hi := 0.9*gb*1e9, 1.1*gb*(1<<30)
		if mem := float64(a.MemoryBytes); mem < lo || mem > hi {
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

// gpuUUIDs is the set of GPU UUIDs in f (nil f: none).
func gpuUUIDs(f *nodeproto.NodeFacts) map[string]bool {
	out := map[string]bool{}
	if f != nil {
		for _, a := range f.Accelerators {
			out[a.UUID] = true
		}
	}
	return out
}

// claimsGPUs reports whether a batch carries a facts report naming any
// GPU: such a batch reads the fleet (applyFacts) and so is committed
// through store.Update, whose isolation sees a claim committed
// concurrently, rather than UpdateLocked, whose List may miss it.
func claimsGPUs(b nodeproto.EventBatch) bool {
	for _, ev := range b.Events {
		if ev.Kind == nodeproto.EventFacts && ev.Facts != nil && len(ev.Facts.Accelerators) > 0 {
			return true
		}
	}
	return false
}

// applyFacts applies one facts report inside tx and returns the flags it
// raised that the node did not carry before (for the metric and the log).
// A refused report leaves the node's facts as they were. A report naming a
// GPU the node did not name before is checked against every other enrolled
// node (removed ones excepted): a UUID another claims is disputed on both.
// Only a change of the GPUs listed costs that read of the fleet, so a fleet
// pays it about once per machine.
func (s *Server) applyFacts(tx store.Tx, nodeID string, f *nodeproto.NodeFacts) ([]api.NodeFlag, error) {
	now := s.now()
	n, err := tx.GetNode(nodeID)
	if err != nil {
		return nil, err
	}
	j := judgeFacts(n.Facts, f, now)
	claimed := gpuUUIDs(n.Facts)
	if j.facts != nil {
		claimed = gpuUUIDs(j.facts)
	}
	flags := j.flags
	// Disputes outlive reports while the node still claims the GPU.
	for _, fl := range n.Flags {
		if fl.Kind == api.NodeFlagGPUDisputed && claimed[fl.GPU] {
			flags = append(flags, fl)
		}
	}
	if j.facts == nil {
		s.log.Warn("node facts refused", "node", nodeID, "reason", j.refusal)
	} else if newClaims(n.Facts, claimed) {
		if flags, err = s.disputeClaims(tx, nodeID, claimed, flags, now); err != nil {
			return nil, err
		}
	}
	raised := keepSince(n.Flags, flags)
	n.Flags = flags
	if j.facts != nil {
		n.Facts, n.FactsAt = j.facts, &now
	}
	return raised, tx.PutNode(n)
}

// newClaims reports whether claimed names a GPU that prev did not.
func newClaims(prev *nodeproto.NodeFacts, claimed map[string]bool) bool {
	had := gpuUUIDs(prev)
	for u := range claimed {
		if !had[u] {
			return true
		}
	}
	return false
}

// disputeClaims disputes, on nodeID (its flags are given and returned) and
// on every other enrolled node, each GPU of claimed that the other node
// also lists. The other nodes' records are written in tx.
func (s *Server) disputeClaims(tx store.Tx, nodeID string, claimed map[string]bool, flags []api.NodeFlag, now time.Time) ([]api.NodeFlag, error) {
	others, err := tx.ListNodes()
	if err != nil {
		return nil, err
	}
	for _, o := range others {
		if o.ID == nodeID || o.RemovedAt != nil || o.Facts == nil {
			continue
		}
		changed := false
		for _, a := range o.Facts.Accelerators {
			if !claimed[a.UUID] {
				continue
			}
			flags = addDispute(flags, a.UUID, o.ID, now)
			if d := addDispute(o.Flags, a.UUID, nodeID, now); len(d) != len(o.Flags) {
				o.Flags, changed = d, true
				s.metrics.FactFlags.WithLabelValues(api.NodeFlagGPUDisputed).Inc()
				s.log.Warn("GPU disputed", "node", o.ID, "gpu", a.UUID, "also_claimed_by", nodeID)
			}
		}
		if changed {
			if err := tx.PutNode(o); err != nil {
				return nil, err
			}
		}
	}
	return flags, nil
}

// addDispute adds a gpu_disputed flag for uuid, naming the other claimant,
// unless flags already dispute uuid; it returns flags, extended or not.
func addDispute(flags []api.NodeFlag, uuid, other string, now time.Time) []api.NodeFlag {
	for _, fl := range flags {
		if fl.Kind == api.NodeFlagGPUDisputed && fl.GPU == uuid {
			return flags
		}
	}
	return append(slices.Clip(flags), api.NodeFlag{Kind: api.NodeFlagGPUDisputed, GPU: uuid, Since: now,
		Detail: fmt.Sprintf("GPU %q is also claimed by node %s; neither node gets work on it until an operator clears it (`mercator node gpu-clear NODE %s` on the node whose claim stands, `mercator node rm` for the other)", uuid, other, uuid)})
}

// keepSince returns the flags in next that old does not carry (same kind,
// GPU and detail), and gives those it does carry their old Since, so a
// flag's Since is when it was first raised.
func keepSince(old, next []api.NodeFlag) []api.NodeFlag {
	var raised []api.NodeFlag
	for i := range next {
		j := slices.IndexFunc(old, func(o api.NodeFlag) bool {
			return o.Kind == next[i].Kind && o.GPU == next[i].GPU && o.Detail == next[i].Detail
		})
		if j >= 0 {
			next[i].Since = old[j].Since
		} else {
			raised = append(raised, next[i])
		}
	}
	return raised
}

// hasFlag reports whether a node carries a flag of kind.
func hasFlag(n store.Node, kind string) bool {
	return slices.ContainsFunc(n.Flags, func(f api.NodeFlag) bool { return f.Kind == kind })
}

// disputedGPUs is the set of GPUs disputed on a node (nil: none).
func disputedGPUs(n store.Node) map[string]bool {
	var out map[string]bool
	for _, f := range n.Flags {
		if f.Kind == api.NodeFlagGPUDisputed {
			if out == nil {
				out = map[string]bool{}
			}
			out[f.GPU] = true
		}
	}
	return out
}

// clearGPUDispute is the operator's word that a node's claim to a GPU
// stands: its gpu_disputed flag for that UUID is removed and the GPU may be
// placed on again. The other claimant's dispute is its own (cleared there,
// or ended by removing that node).
func (s *Server) clearGPUDispute(w http.ResponseWriter, r *http.Request) {
	uuid := r.PathValue("uuid")
	s.updateNode(w, r, func(n *store.Node) error {
		i := slices.IndexFunc(n.Flags, func(f api.NodeFlag) bool { return f.Kind == api.NodeFlagGPUDisputed && f.GPU == uuid })
		if i < 0 {
			return &failure.Error{Kind: failure.ErrNotFound, Message: fmt.Sprintf("node %s has no dispute over GPU %q; `mercator node get %s` lists its flags", n.ID, uuid, n.ID)}
		}
		n.Flags = slices.Delete(slices.Clone(n.Flags), i, i+1)
		s.log.Info("GPU dispute cleared by an operator", "node", n.ID, "gpu", uuid)
		return nil
	})
}
