package scheduler

// This file keeps the scheduler as it was before it was indexed (commit
// b1f5173): one pass over every node for every run. It is the oracle the
// equivalence property test compares Schedule against, and the baseline the
// benchmark reports its speed-up over. Do not "improve" it: its value is that
// it is obviously what the policy says.

import (
	"fmt"
	"sort"
	"strings"

	"github.com/mercator/mercator/internal/bytesize"
)

type refNodeState struct {
	Node
	freeCPU float64
	freeMem int64
	used    map[string]bool
}

// referenceSchedule is Schedule as it was: for every run, every node.
func referenceSchedule(s Snapshot) Plan {
	nodes := make([]*refNodeState, 0, len(s.Nodes))
	for _, n := range s.Nodes {
		ns := &refNodeState{Node: n, freeCPU: n.CPU - n.UsedCPU, freeMem: n.MemoryBytes - n.UsedMemory, used: map[string]bool{}}
		// A disputed GPU, or a UUID listed again, is no device to place on.
		ns.GPUs = nil
		listed := map[string]bool{}
		for _, g := range n.GPUs {
			if !g.Disputed && !g.Quarantined && !listed[g.UUID] {
				ns.GPUs = append(ns.GPUs, g)
			}
			listed[g.UUID] = true
		}
		for u, v := range n.UsedGPUs {
			ns.used[u] = v
		}
		nodes = append(nodes, ns)
	}
	plan := Plan{Waiting: map[string]string{}}
	for _, r := range s.Pending {
		if r.Nodes > 1 {
			refGang(nodes, r, &plan)
			continue
		}
		var best *refNodeState
		var bestGPUs []string
		reasons := map[string][]string{}
		for _, n := range nodes {
			gpus, why := refFit(n, r)
			if why != "" {
				reasons[why] = append(reasons[why], n.ID)
				continue
			}
			if best == nil || refBetter(r, n, gpus, best) {
				best, bestGPUs = n, gpus
			}
		}
		if best == nil {
			plan.Waiting[r.ID] = refExplain(len(nodes), reasons)
			continue
		}
		best.freeCPU -= r.CPU
		best.freeMem -= r.MemoryBytes
		for _, g := range bestGPUs {
			best.used[g] = true
		}
		plan.Placements = append(plan.Placements, Placement{RunID: r.ID, NodeID: best.ID, GPUs: bestGPUs})
	}
	return plan
}

// fit returns the GPUs the run would get on n, or why it cannot go there.
// The reason strings are grouped verbatim, so they must not contain
// node-specific figures.
func refFit(n *refNodeState, r Run) ([]string, string) {
	switch {
	case !n.Ready:
		if n.NotReadyReason != "" {
			return nil, n.NotReadyReason
		}
		return nil, "is not ready"
	case n.Cordoned:
		return nil, "is cordoned"
	case n.CPU == 0 || n.MemoryBytes == 0:
		return nil, "has not reported its facts yet"
	case r.MinAgentVersion > max(n.AgentVersion, 1):
		return nil, olderAgentText(r.MinAgentVersion)
	case r.CPU > n.CPU:
		return nil, fmt.Sprintf("has fewer CPUs than requested (need %g)", r.CPU)
	case r.MemoryBytes > n.MemoryBytes:
		return nil, fmt.Sprintf("has less memory than requested (need %s)", bytesize.Format(r.MemoryBytes))
	case r.CPU > n.freeCPU+1e-9:
		return nil, fmt.Sprintf("has too little free CPU (need %g)", r.CPU)
	case r.MemoryBytes > n.freeMem:
		return nil, fmt.Sprintf("has too little free memory (need %s)", bytesize.Format(r.MemoryBytes))
	}
	if r.GPUs == 0 {
		return nil, ""
	}
	var matching, free []string
	for _, g := range n.GPUs {
		if r.GPUModel != "" && !strings.Contains(strings.ToLower(g.Model), strings.ToLower(r.GPUModel)) {
			continue
		}
		if r.GPUMemory > 0 && g.MemoryBytes < r.GPUMemory {
			continue
		}
		matching = append(matching, g.UUID)
		if !n.used[g.UUID] {
			free = append(free, g.UUID)
		}
	}
	switch {
	case len(matching) < r.GPUs:
		return nil, fmt.Sprintf("have fewer than %d matching GPUs", r.GPUs)
	case len(free) < r.GPUs:
		return nil, fmt.Sprintf("have too few free GPUs (need %d)", r.GPUs)
	}
	sort.Strings(free)
	return free[:r.GPUs], ""
}

func refBetter(r Run, n *refNodeState, gpus []string, best *refNodeState) bool {
	if hn, hb := n.Images[r.Image], best.Images[r.Image]; hn != hb {
		return hn
	}
	if r.GPUs > 0 {
		fn, fb := refFreeGPUs(n), refFreeGPUs(best)
		if fn != fb {
			return fn < fb
		}
	} else if n.freeMem != best.freeMem {
		return n.freeMem > best.freeMem
	}
	return n.ID < best.ID
}

func refFreeGPUs(n *refNodeState) int {
	c := 0
	for _, g := range n.GPUs {
		if !n.used[g.UUID] {
			c++
		}
	}
	return c
}

func refExplain(total int, reasons map[string][]string) string {
	if total == 0 {
		return "waiting: no nodes are enrolled; invite one with `mercator node invite NODE_ID`"
	}
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if len(reasons[keys[i]]) != len(reasons[keys[j]]) {
			return len(reasons[keys[i]]) > len(reasons[keys[j]])
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		n := len(reasons[k])
		noun := "nodes"
		if n == 1 {
			noun = "node"
		}
		parts = append(parts, fmt.Sprintf("%d %s %s", n, noun, singular(k, n)))
	}
	return "waiting: " + strings.Join(parts, "; ")
}

// refGang is the gang policy by the definition: each member on the best
// node (refBetter) that fits it and that no earlier member took; all
// members placed, or none and a reason naming how many nodes fit. Where
// those first N mix link readings, the policy's next choices are listed
// too, up to linkCandidates, and matchingLinks picks the members.
func refGang(nodes []*refNodeState, r Run, plan *Plan) {
	var chosen []*refNodeState
	var gpus [][]string
	limit := r.Nodes
	for len(chosen) < limit {
		var best *refNodeState
		var bestGPUs []string
		for _, n := range nodes {
			taken := false
			for _, c := range chosen {
				taken = taken || c == n
			}
			if g, why := refFit(n, r); why == "" && !taken && (best == nil || refBetter(r, n, g, best)) {
				best, bestGPUs = n, g
			}
		}
		if best == nil {
			if len(chosen) >= r.Nodes {
				break
			}
			plan.Waiting[r.ID] = gangText(&r, shapeOf(&r), len(chosen))
			return
		}
		chosen, gpus = append(chosen, best), append(gpus, bestGPUs)
		if len(chosen) == r.Nodes && refMixed(chosen) {
			limit = linkCandidates(r.Nodes)
		}
		if len(chosen) > r.Nodes && !refMixed(refPick(chosen, r.Nodes)) {
			break
		}
	}
	if len(chosen) > r.Nodes {
		var picked []*refNodeState
		var pickedGPUs [][]string
		for _, pos := range refPositions(chosen, r.Nodes) {
			picked, pickedGPUs = append(picked, chosen[pos]), append(pickedGPUs, gpus[pos])
		}
		chosen, gpus = picked, pickedGPUs
	}
	for rank, n := range chosen {
		n.freeCPU -= r.CPU
		n.freeMem -= r.MemoryBytes
		for _, g := range gpus[rank] {
			n.used[g] = true
		}
		plan.Placements = append(plan.Placements, Placement{RunID: r.ID, NodeID: n.ID, GPUs: gpus[rank], Rank: rank})
	}
}

// refMixed reports whether the nodes' link readings are further apart than
// linkMatchRatio.
func refMixed(nodes []*refNodeState) bool {
	for _, a := range nodes {
		for _, b := range nodes {
			if float64(linkFloor(&a.Node)) > linkMatchRatio*float64(linkFloor(&b.Node)) {
				return true
			}
		}
	}
	return false
}

// refPositions is matchingLinks of the nodes' readings.
func refPositions(nodes []*refNodeState, n int) []int {
	floors := make([]int64, len(nodes))
	for i, node := range nodes {
		floors[i] = linkFloor(&node.Node)
	}
	return matchingLinks(floors, n)
}

// refPick is the nodes matchingLinks picks.
func refPick(nodes []*refNodeState, n int) []*refNodeState {
	var out []*refNodeState
	for _, pos := range refPositions(nodes, n) {
		out = append(out, nodes[pos])
	}
	return out
}
