// Package scheduler decides where pending runs go. It is a pure function:
// a Snapshot of the fleet and the pending work in, a Plan out. It does no
// I/O and reads no clock, so every placement decision can be replayed and
// tested exactly; the control plane commits the plan and turns it into
// operations.
//
// # Policy
//
// Feasibility is a list of small predicates (the node is ready and not
// cordoned; enough free CPU, memory and GPUs of the requested model and
// memory). Free capacity subtracts everything running and everything placed
// but not yet started. Among feasible nodes the score prefers, in order:
//
//  1. a node that already holds the run's image (no pull before start);
//  2. for GPU runs, the node with the fewest free GPUs that still fits
//     (packing keeps whole machines free for large jobs);
//  3. for CPU-only runs, the node with the most free memory (spreading);
//  4. the node ID, so equal scores are broken deterministically.
//
// A run that fits nowhere is left pending with a Reason that counts why
// each node was rejected ("waiting: 2 nodes have too little free memory
// (need 64.0 MiB); 1 node is unreachable").
//
// Only the control plane imports scheduler.
package scheduler

import (
	"fmt"
	"sort"
	"strings"
)

// Snapshot is everything the scheduler may consider. The caller owns it;
// Plan does not modify it.
type Snapshot struct {
	Nodes []Node
	// Pending runs, in the order they should be considered (oldest first).
	Pending []Run
}

// Node is one machine as the scheduler sees it.
type Node struct {
	ID string
	// Ready is false for a node past its lease or never enrolled;
	// NotReadyReason says which.
	Ready          bool
	NotReadyReason string
	// Cordoned nodes take no new work.
	Cordoned bool
	// Capacity as the node measured it. Zero CPU or memory means the node
	// has not reported facts yet, and it is not feasible for anything.
	CPU         float64
	MemoryBytes int64
	GPUs        []GPU
	// Used is what running and placed-but-not-started attempts hold.
	UsedCPU    float64
	UsedMemory int64
	UsedGPUs   map[string]bool
	// Images holds pinned references (repo@sha256:…) present on the node.
	Images map[string]bool
}

// GPU is one device.
type GPU struct {
	UUID        string
	Model       string
	MemoryBytes int64
}

// Run is a pending run's request.
type Run struct {
	ID          string
	Image       string
	CPU         float64
	MemoryBytes int64
	GPUs        int
	GPUModel    string // substring match, case-insensitive; "" means any
	GPUMemory   int64  // minimum per device; 0 means any
}

// Plan is the scheduler's answer.
type Plan struct {
	Placements []Placement
	// Waiting explains every run not placed, by run ID.
	Waiting map[string]string
}

// Placement assigns one run to one node and, for GPU runs, to exact devices.
type Placement struct {
	RunID  string
	NodeID string
	GPUs   []string
}

type nodeState struct {
	Node
	freeCPU float64
	freeMem int64
	used    map[string]bool
}

// Schedule places as many pending runs as fit, in order. Placements made earlier
// in the same call count against capacity for later runs, so one plan never
// over-commits a node or hands a GPU out twice.
func Schedule(s Snapshot) Plan {
	nodes := make([]*nodeState, 0, len(s.Nodes))
	for _, n := range s.Nodes {
		ns := &nodeState{Node: n, freeCPU: n.CPU - n.UsedCPU, freeMem: n.MemoryBytes - n.UsedMemory, used: map[string]bool{}}
		for u, v := range n.UsedGPUs {
			ns.used[u] = v
		}
		nodes = append(nodes, ns)
	}
	plan := Plan{Waiting: map[string]string{}}
	for _, r := range s.Pending {
		var best *nodeState
		var bestGPUs []string
		reasons := map[string][]string{}
		for _, n := range nodes {
			gpus, why := fit(n, r)
			if why != "" {
				reasons[why] = append(reasons[why], n.ID)
				continue
			}
			if best == nil || better(r, n, gpus, best) {
				best, bestGPUs = n, gpus
			}
		}
		if best == nil {
			plan.Waiting[r.ID] = explain(len(nodes), reasons)
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
func fit(n *nodeState, r Run) ([]string, string) {
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
	case r.CPU > n.CPU:
		return nil, fmt.Sprintf("has fewer CPUs than requested (need %g)", r.CPU)
	case r.MemoryBytes > n.MemoryBytes:
		return nil, fmt.Sprintf("has less memory than requested (need %s)", Bytes(r.MemoryBytes))
	case r.CPU > n.freeCPU+1e-9:
		return nil, fmt.Sprintf("has too little free CPU (need %g)", r.CPU)
	case r.MemoryBytes > n.freeMem:
		return nil, fmt.Sprintf("has too little free memory (need %s)", Bytes(r.MemoryBytes))
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

func better(r Run, n *nodeState, gpus []string, best *nodeState) bool {
	if hn, hb := n.Images[r.Image], best.Images[r.Image]; hn != hb {
		return hn
	}
	if r.GPUs > 0 {
		fn, fb := freeGPUs(n), freeGPUs(best)
		if fn != fb {
			return fn < fb
		}
	} else if n.freeMem != best.freeMem {
		return n.freeMem > best.freeMem
	}
	return n.ID < best.ID
}

func freeGPUs(n *nodeState) int {
	c := 0
	for _, g := range n.GPUs {
		if !n.used[g.UUID] {
			c++
		}
	}
	return c
}

func explain(total int, reasons map[string][]string) string {
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

// singular turns "have" into "has" for one node; reasons are written for the
// plural ("2 nodes have …") or already in the singular ("has …", "is …").
func singular(reason string, n int) string {
	if n == 1 && strings.HasPrefix(reason, "have ") {
		return "has " + strings.TrimPrefix(reason, "have ")
	}
	if n > 1 {
		switch {
		case strings.HasPrefix(reason, "has "):
			return "have " + strings.TrimPrefix(reason, "has ")
		case strings.HasPrefix(reason, "is "):
			return "are " + strings.TrimPrefix(reason, "is ")
		}
	}
	return reason
}

// Bytes formats a byte count for people, in binary units.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
