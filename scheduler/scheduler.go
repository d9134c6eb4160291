// Package scheduler decides where pending runs go. It is a pure function:
// a Snapshot of the fleet and the pending work in, a Plan out. It does no
// I/O and reads no clock, so every placement decision can be replayed and
// tested exactly; the control plane commits the plan and turns it into
// operations.
//
// # Policy
//
// Feasibility is a list of small predicates (the node is ready and not
// cordoned; its artifact-copy floor is at least the run's; enough free CPU,
// memory and GPUs of the requested model and memory). A node's GPUs are
// those it lists, less the disputed ones and any UUID listed again (GPU). Free capacity
// subtracts everything running and everything placed but not yet started.
// Among feasible nodes the score prefers, in order:
//
//  0. a node that already holds every Artifact the run mounts, and among
//     those one that also holds its image (artifacts.go);
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
// # Cost
//
// Schedule gives the plan that checking every node for every run gives, but
// does not check every node for every run: it indexes the fleet once per
// call (index.go says how and why each shortcut changes no decision), and
// the equivalence property test holds it to the original scan, kept in
// reference_test.go. On a 2-core machine it plans 100,000 queued runs onto
// 10,000 machines in about 0.4 s, some 150,000 placements a second; the
// benchmark in bench_test.go measures it at 1,000 to 50,000 machines.
//
// Only the control plane imports scheduler.
package scheduler

import (
	"fmt"
	"sort"
	"strings"

	"github.com/mercator/mercator/internal/bytesize"
)

// Snapshot is everything the scheduler may consider. The caller owns it;
// Plan does not modify it.
type Snapshot struct {
	Nodes []Node
	// Pending runs, in the order they should be considered (oldest first).
	Pending []Run
	// Teams (projects.go, preempt.go): with Projects set, runs are planned
	// by project quota, priority and fair share, and Running is the work
	// they account for and may preempt. Without, the policy is the one
	// above, first come first served.
	Projects []Project
	Running  []Running
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
	// Artifacts holds the SHA-256 digests of the Artifact content present
	// on the node, and LinkFloorBPS the rate at which it copies Artifact
	// content: its measured floor, or the fleet's assumption when it has
	// none (see artifacts.go).
	Artifacts    map[string]bool
	LinkFloorBPS int64
	// Labels are the node's labels (its agent's and its operator's), which
	// runs' Constraints select on.
	Labels map[string]string
	// AgentVersion is the capability version the node's agent speaks
	// (nodeproto.Version as the agent reported it; 0, not reported, is
	// read as 1). A run needing a later one does not go there: the node
	// would have to wait for an upgrade while another could run it now.
	AgentVersion int
}

// GPU is one device. A Disputed GPU is never placed on: another node
// claims the same UUID, and until an operator says whose it is, giving it
// to either could give one device to two runs. A UUID a node lists more
// than once is one device, placed once.
type GPU struct {
	UUID        string
	Model       string
	MemoryBytes int64
	Disputed    bool
	// Quarantined: the GPU went bad or an operator cordoned it; never
	// placed on (gpuhealth.go).
	Quarantined bool
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
	// Artifacts are the SHA-256 digests of the Artifact content the run
	// mounts, and MinReadBPS the slowest artifact-copy floor it accepts (0:
	// any). See artifacts.go.
	Artifacts  []string
	MinReadBPS int64
	// MinAgentVersion is the capability version the run's commands need
	// (nodeproto.RequiredVersion); 0 or 1 is any agent.
	MinAgentVersion int
	// Nodes, when above 1, makes the run a gang: that many members of this
	// shape, one per node, placed together or not at all (gang.go).
	Nodes int
	// Project ("" is "default") and Priority order it when the snapshot
	// names projects (projects.go).
	Project  string
	Priority int
	// Constraints are the node labels it requires: each key's label must
	// be one of its values (labels.go); nil is any node.
	Constraints map[string][]string
}

// Plan is the scheduler's answer.
type Plan struct {
	Placements []Placement
	// Waiting explains every run not placed, by run ID.
	Waiting map[string]string
	// Preemptions are the running attempts to stop to make room for
	// waiting runs (preempt.go), and Shares each project's dominant share
	// of the fleet once the plan is carried out (projects.go, for the
	// caller's History); only with projects.
	Preemptions []Preemption
	Shares      map[string]float64
	// Order is the waiting runs in the order the scheduler would take
	// them across projects should there be room (queueorder.go); only
	// with projects.
	Order []string
}

// Placement assigns one run to one node and, for GPU runs, to exact devices.
type Placement struct {
	RunID  string
	NodeID string
	GPUs   []string
	// Rank is the member's rank in a gang (0 for a run that is not one).
	Rank int
}

// Schedule places as many pending runs as fit, in order. Placements made earlier
// in the same call count against capacity for later runs, so one plan never
// over-commits a node or hands a GPU out twice.
//
// The plan is exactly the one the policy defines when every run is checked
// against every node (the package doc); what Schedule adds is that it does
// not do that. It indexes the fleet once per call and answers each run from
// the index (see index.go), so the cost of a call typically grows with the
// number of runs times the logarithm of the fleet rather than with their
// product (a search can still visit many nodes whose maxima promise room
// that no single node has). That matters because a control plane re-plans
// its whole queue on every submission, finished attempt and fact report.
//
// Schedule reads s and never modifies it or anything it refers to; the Plan
// shares nothing with s (GPU slices are fresh). A Run asking for zero or
// fewer GPUs is a CPU run. It is safe to call concurrently.
func Schedule(s Snapshot) Plan {
	if len(s.Projects) > 0 {
		return scheduleTeams(s) // projects.go
	}
	x := newIndex(s.Nodes)
	plan := Plan{Waiting: map[string]string{}}
	for i := range s.Pending {
		r := &s.Pending[i]
		sh := shapeOf(r)
		if r.Nodes > 1 {
			x.scheduleGang(r, sh, &plan) // gang.go
			continue
		}
		if best := x.place(r, sh); best >= 0 {
			plan.Placements = append(plan.Placements, Placement{RunID: r.ID, NodeID: x.nodes[best].node.ID, GPUs: x.commit(best, r, sh)})
			continue
		}
		plan.Waiting[r.ID] = x.explain(sh)
	}
	return plan
}

// rejection is why one node cannot take one run, in the order the
// predicates are checked: the first that fails is the one reported, exactly
// one per node, so the counts in a waiting reason add up to the fleet.
type rejection uint8

const (
	fits rejection = iota
	// notReady, cordoned and noFacts depend on the node alone.
	notReady
	cordoned
	noFacts
	// The rest depend on the run, and the four "free" ones on what was
	// placed before it.
	missingLabel // the node lacks a label the run requires (labels.go)
	olderAgent   // the node's agent is older than the run needs
	fewerCPUs
	lessMemory
	freeCPU
	freeMemory
	fewerMatchingGPUs
	freeGPUs
	belowFloor // the node's artifact-copy floor is below the run's (artifacts.go)
	rejections // the number of rejections, fits included
)

// text is the rejection in the words of a waiting reason, with the run's
// figures. The strings are grouped verbatim, so they must not contain
// node-specific figures; notReady has its own text per node (staticText).
func (why rejection) text(sh shape) string {
	switch why {
	case fewerCPUs:
		return fmt.Sprintf("has fewer CPUs than requested (need %g)", sh.cpu)
	case lessMemory:
		return fmt.Sprintf("has less memory than requested (need %s)", bytesize.Format(sh.mem))
	case freeCPU:
		return fmt.Sprintf("has too little free CPU (need %g)", sh.cpu)
	case freeMemory:
		return fmt.Sprintf("has too little free memory (need %s)", bytesize.Format(sh.mem))
	case fewerMatchingGPUs:
		return fmt.Sprintf("have fewer than %d matching GPUs", sh.gpus)
	case freeGPUs:
		return fmt.Sprintf("have too few free GPUs (need %d)", sh.gpus)
	case belowFloor:
		return floorText(sh)
	case olderAgent:
		return olderAgentText(sh.minVersion)
	case missingLabel:
		return "have no label " + sh.labels
	case cordoned:
		return "is cordoned"
	case noFacts:
		return "has not reported its facts yet"
	default:
		return "is not ready"
	}
}

// olderAgentText is the waiting reason of olderAgent (shared with the
// reference implementation the tests compare against).
func olderAgentText(need int) string {
	return fmt.Sprintf("has an agent too old for this run (need capability version %d or later; upgrade the agent)", need)
}

// explain writes a waiting reason from how many nodes were rejected for
// each reason text.
func explain(total int, counts map[string]int) string {
	if total == 0 {
		return "waiting: no nodes are enrolled; invite one with `mercator node invite NODE_ID`"
	}
	keys := make([]string, 0, len(counts))
	for k, n := range counts {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if counts[keys[i]] != counts[keys[j]] {
			return counts[keys[i]] > counts[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		n := counts[k]
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
