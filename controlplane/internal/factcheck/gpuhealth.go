package factcheck

// GPU quarantine: a node's report that a GPU is sick, and an operator's
// cordon, withhold the card from placement with a flag that, like a
// dispute, outlives the reports that follow while the node lists the card.
// Only an operator returns it (Uncordon), after a reset or a look: a card
// that fell off the bus and came back is not trusted on its own word.

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// gpuFlagKinds are the GPU flags that outlive reports (besides disputes).
var gpuFlagKinds = []string{api.NodeFlagGPUUnhealthy, api.NodeFlagGPUCordoned, api.NodeFlagGPUUncordoned}

// carryGPUFlags returns old's quarantine flags for GPUs still claimed.
func carryGPUFlags(old []api.NodeFlag, claimed map[string]bool) []api.NodeFlag {
	var out []api.NodeFlag
	for _, fl := range old {
		if slices.Contains(gpuFlagKinds, fl.Kind) && claimed[fl.GPU] {
			out = append(out, fl)
		}
	}
	return out
}

// quarantine raises a gpu_unhealthy flag for each GPU health reports sick
// that is claimed, not already quarantined, and was seen sick after an
// operator last uncordoned it, and returns flags with them and the GPUs it
// quarantined.
func quarantine(flags []api.NodeFlag, health []nodeproto.GPUHealth, claimed map[string]bool) ([]api.NodeFlag, []lifecycle.SickGPU) {
	var sick []lifecycle.SickGPU
	for _, h := range health {
		if h.State != nodeproto.GPUSick || !claimed[h.UUID] {
			continue
		}
		if i := flagFor(flags, api.NodeFlagGPUUnhealthy, h.UUID); i >= 0 {
			continue
		}
		if i := flagFor(flags, api.NodeFlagGPUUncordoned, h.UUID); i >= 0 && !h.Since.After(flags[i].Since) {
			continue // the operator returned it after this was seen
		}
		flags = append(slices.Clip(flags), api.NodeFlag{Kind: api.NodeFlagGPUUnhealthy, GPU: h.UUID, Since: h.Since,
			Detail: h.Reason + ": " + h.Detail})
		sick = append(sick, lifecycle.SickGPU{UUID: h.UUID, Reason: h.Reason, Detail: h.Detail})
	}
	return flags, sick
}

// flagFor is the index of the flag of kind for uuid, or -1.
func flagFor(flags []api.NodeFlag, kind, uuid string) int {
	return slices.IndexFunc(flags, func(f api.NodeFlag) bool { return f.Kind == kind && f.GPU == uuid })
}

// listsGPU refuses a GPU the node does not list, as not found.
func listsGPU(n *store.Node, uuid string) error {
	if n.Facts != nil && slices.ContainsFunc(n.Facts.Accelerators, func(a nodeproto.Accelerator) bool { return a.UUID == uuid }) {
		return nil
	}
	return &failure.Error{Kind: failure.ErrNotFound, Message: fmt.Sprintf("node %s lists no GPU %q; `mercator node gpu ls %s` lists its GPUs", n.ID, uuid, n.ID)}
}

// Cordon withholds a GPU of the node from placement until Uncordon; what
// runs on it goes on. Cordoning a cordoned GPU changes nothing. A GPU the
// node does not list is not found.
func Cordon(n *store.Node, uuid string, now time.Time) error {
	if err := listsGPU(n, uuid); err != nil {
		return err
	}
	if flagFor(n.Flags, api.NodeFlagGPUCordoned, uuid) < 0 {
		n.Flags = append(slices.Clip(n.Flags), api.NodeFlag{Kind: api.NodeFlagGPUCordoned, GPU: uuid, Since: now, Detail: "withheld by an operator"})
	}
	return nil
}

// Uncordon returns a GPU to service: its cordon and its quarantine are
// lifted, and a sickness the node saw before now is not raised again (a
// later one is). A dispute is not lifted (Clear is for that). A GPU the
// node does not list is not found.
func Uncordon(n *store.Node, uuid string, now time.Time) error {
	if err := listsGPU(n, uuid); err != nil {
		return err
	}
	n.Flags = slices.DeleteFunc(slices.Clone(n.Flags), func(f api.NodeFlag) bool {
		return f.GPU == uuid && slices.Contains(gpuFlagKinds, f.Kind)
	})
	n.Flags = append(n.Flags, api.NodeFlag{Kind: api.NodeFlagGPUUncordoned, GPU: uuid, Since: now, Detail: "returned to service by an operator"})
	return nil
}

// Withheld is, for each GPU of the node that must not be placed on, why
// (nil: none): a quarantine, a cordon or a dispute.
func Withheld(n store.Node) map[string]string {
	var out map[string]string
	for _, f := range n.Flags {
		if f.Kind == api.NodeFlagGPUUnhealthy || f.Kind == api.NodeFlagGPUCordoned || f.Kind == api.NodeFlagGPUDisputed {
			if out == nil {
				out = map[string]string{}
			}
			if _, ok := out[f.GPU]; !ok {
				out[f.GPU] = f.Kind
			}
		}
	}
	return out
}

// GPUs is each GPU the node lists, with its state as placement sees it and
// the node's own present word (api.NodeGPU).
func GPUs(n store.Node) []api.NodeGPU {
	if n.Facts == nil {
		return nil
	}
	reported := map[string]nodeproto.GPUHealth{}
	for _, h := range n.Facts.GPUHealth {
		reported[h.UUID] = h
	}
	var out []api.NodeGPU
	for _, a := range n.Facts.Accelerators {
		g := api.NodeGPU{UUID: a.UUID, Model: a.Model, State: api.GPUStateHealthy, Reported: reported[a.UUID].State}
		if h, ok := reported[a.UUID]; ok {
			g.Since = h.Since
		}
		for _, kind := range []string{api.NodeFlagGPUDisputed, api.NodeFlagGPUUnhealthy, api.NodeFlagGPUCordoned} {
			i := flagFor(n.Flags, kind, a.UUID)
			if i < 0 {
				continue
			}
			f := n.Flags[i]
			g.Since, g.Detail = f.Since, f.Detail
			switch kind {
			case api.NodeFlagGPUDisputed:
				g.State, g.Reason = api.GPUStateDisputed, kind
			case api.NodeFlagGPUUnhealthy:
				g.State = api.GPUStateSick
				g.Reason, g.Detail, _ = strings.Cut(f.Detail, ": ")
			case api.NodeFlagGPUCordoned:
				g.State, g.Reason = api.GPUStateCordoned, kind
			}
			break
		}
		out = append(out, g)
	}
	return out
}

// CountStates is how many GPUs of the enrolled nodes are in each state
// (every api.GPUState… named, zero or not).
func CountStates(nodes []store.Node) map[string]int {
	counts := map[string]int{api.GPUStateHealthy: 0, api.GPUStateSick: 0, api.GPUStateCordoned: 0, api.GPUStateDisputed: 0}
	for _, n := range nodes {
		if n.RemovedAt == nil {
			for _, g := range GPUs(n) {
				counts[g.State]++
			}
		}
	}
	return counts
}

// newAppXids are the application Xids in report f that prev (the node's
// previous facts, nil for none) did not carry, for GPUs the node lists:
// a report repeats a card's recent Xids until newer ones push them out.
func newAppXids(prev, f *nodeproto.NodeFacts) []api.GPUXid {
	seen := map[string]bool{}
	if prev != nil {
		for _, h := range prev.GPUHealth {
			for _, x := range h.XIDs {
				seen[fmt.Sprint(h.UUID, x.Xid, x.At.UnixNano())] = true
			}
		}
	}
	var out []api.GPUXid
	for _, h := range f.GPUHealth {
		for _, x := range h.XIDs {
			if x.Class == nodeproto.XidClassApplication && !seen[fmt.Sprint(h.UUID, x.Xid, x.At.UnixNano())] {
				out = append(out, api.GPUXid{GPU: h.UUID, Xid: x.Xid, At: x.At, Detail: x.Detail})
			}
		}
	}
	return out
}
