package factcheck

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Outcome is what Apply did: the flags it raised on the reporting node that
// the node did not carry before, the disputes it raised on other nodes, and
// the refusal when the report was refused.
type Outcome struct {
	Raised   []api.NodeFlag
	Disputes []Dispute
	Refusal  string
	// Quarantined are the GPUs this report quarantined (gpuhealth.go):
	// the attempts on them are to be ended as gpu_failed.
	Quarantined []lifecycle.SickGPU
	// AppXids are the application Xids first reported here: to be filed
	// against the attempts holding their GPUs.
	AppXids []api.GPUXid
}

// Dispute is a gpu_disputed flag raised on another node than the one
// reporting.
type Dispute struct{ Node, GPU string }

// ClaimsGPUs reports whether a batch carries a facts report naming any GPU.
// Apply reads the fleet for such a report, so the batch must be committed
// through store.Update, whose isolation sees a claim committed
// concurrently, rather than UpdateLocked, whose List may miss it.
func ClaimsGPUs(b nodeproto.EventBatch) bool {
	for _, ev := range b.Events {
		if ev.Kind == nodeproto.EventFacts && ev.Facts != nil && len(ev.Facts.Accelerators) > 0 {
			return true
		}
	}
	return false
}

// Apply applies one facts report of node nodeID inside tx (see the package
// doc). A refused report leaves the node's facts as they were. A report
// naming a GPU the node did not name before is checked against every other
// enrolled node (removed ones excepted): a UUID another claims is disputed
// on both, and the other node's record is written too. Only a change of the
// GPUs listed costs that read of the fleet, so a fleet pays it about once
// per machine.
func Apply(tx store.Tx, nodeID string, f *nodeproto.NodeFacts, now time.Time) (Outcome, error) {
	n, err := tx.GetNode(nodeID)
	if err != nil {
		return Outcome{}, err
	}
	j := Judge(n.Facts, f, now)
	claimed := uuids(n.Facts)
	if j.Facts != nil {
		claimed = uuids(j.Facts)
	}
	flags := j.Flags
	for _, fl := range n.Flags { // disputes outlive reports while the GPU is claimed
		if fl.Kind == api.NodeFlagGPUDisputed && claimed[fl.GPU] {
			flags = append(flags, fl)
		}
	}
	flags = append(flags, carryGPUFlags(n.Flags, claimed)...)
	out := Outcome{Refusal: j.Refusal}
	if j.Facts != nil {
		flags, out.Quarantined = quarantine(flags, j.Facts.GPUHealth, claimed)
		out.AppXids = newAppXids(n.Facts, j.Facts)
	}
	if j.Facts != nil && newClaims(n.Facts, claimed) {
		if flags, out.Disputes, err = dispute(tx, nodeID, claimed, flags, now); err != nil {
			return Outcome{}, err
		}
	}
	out.Raised = keepSince(n.Flags, flags)
	n.Flags = flags
	if j.Facts != nil {
		n.Facts, n.FactsAt = j.Facts, &now
	}
	return out, tx.PutNode(n)
}

// uuids is the set of GPU UUIDs in f (nil f: none).
func uuids(f *nodeproto.NodeFacts) map[string]bool {
	out := map[string]bool{}
	if f != nil {
		for _, a := range f.Accelerators {
			out[a.UUID] = true
		}
	}
	return out
}

// newClaims reports whether claimed names a GPU that prev did not.
func newClaims(prev *nodeproto.NodeFacts, claimed map[string]bool) bool {
	had := uuids(prev)
	for u := range claimed {
		if !had[u] {
			return true
		}
	}
	return false
}

// dispute disputes, on nodeID (its flags are given and returned) and on
// every other enrolled node, each GPU of claimed that the other node also
// lists, and returns the disputes raised on the others, whose records it
// writes in tx.
func dispute(tx store.Tx, nodeID string, claimed map[string]bool, flags []api.NodeFlag, now time.Time) ([]api.NodeFlag, []Dispute, error) {
	others, err := tx.ListNodes()
	if err != nil {
		return nil, nil, err
	}
	var raised []Dispute
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
				raised = append(raised, Dispute{Node: o.ID, GPU: a.UUID})
			}
		}
		if changed {
			if err := tx.PutNode(o); err != nil {
				return nil, nil, err
			}
		}
	}
	return flags, raised, nil
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

// Has reports whether a node carries a flag of kind.
func Has(n store.Node, kind string) bool {
	return slices.ContainsFunc(n.Flags, func(f api.NodeFlag) bool { return f.Kind == kind })
}

// Disputed is the set of GPUs disputed on a node (nil: none).
func Disputed(n store.Node) map[string]bool {
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

// Clear is an operator's word that a node's claim to a GPU stands: its
// gpu_disputed flag for uuid is removed, and the GPU may be placed on
// again. The other claimant's dispute is its own (cleared there, or ended
// by removing that node). A node with no such dispute is not found.
func Clear(n *store.Node, uuid string) error {
	i := slices.IndexFunc(n.Flags, func(f api.NodeFlag) bool { return f.Kind == api.NodeFlagGPUDisputed && f.GPU == uuid })
	if i < 0 {
		return &failure.Error{Kind: failure.ErrNotFound, Message: fmt.Sprintf("node %s has no dispute over GPU %q; `mercator node get %s` lists its flags", n.ID, uuid, n.ID)}
	}
	n.Flags = slices.Delete(slices.Clone(n.Flags), i, i+1)
	return nil
}

// Report logs and counts (in flags, by kind) what checking a node's facts
// reports found, once the batch that carried them committed.
func Report(log *slog.Logger, flags *prometheus.CounterVec, nodeID string, found []Outcome) {
	for _, o := range found {
		if o.Refusal != "" {
			log.Warn("node facts refused", "node", nodeID, "reason", o.Refusal)
		}
		for _, f := range o.Raised {
			flags.WithLabelValues(f.Kind).Inc()
			log.Warn("node facts flagged", "node", nodeID, "kind", f.Kind, "gpu", f.GPU, "detail", f.Detail)
		}
		for _, d := range o.Disputes {
			flags.WithLabelValues(api.NodeFlagGPUDisputed).Inc()
			log.Warn("GPU disputed", "node", d.Node, "gpu", d.GPU, "also_claimed_by", nodeID)
		}
	}
}
