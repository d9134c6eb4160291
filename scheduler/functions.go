package scheduler

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/mercator/mercator/nodeproto"
)

// Placement of function calls: pure logic, apart from the I/O that gathers
// its inputs (package controlplane/function).
//
// A call goes to the nodes whose function share can hold one container of
// the function, in an order fixed by the function: rendezvous (highest
// random weight) hashing of the function's ID with each node's ID. Every
// call of a function therefore tries the same node first, which is where
// its hot containers are, and moves to the next node only when that one
// answers busy; adding or losing a node moves only the functions that
// ranked it first. The hash is FNV-1a with a 64-bit finalizer, not a
// process-seeded one, so every control-plane replica computes the same
// order.

// FunctionNode is a node as function placement sees it: its function
// share (what its agent set aside for function containers).
type FunctionNode struct {
	ID        string
	Share     nodeproto.FunctionCapacity
	GPUModels []string // the models of the share's GPUs, in Share.GPUs order
	Pool      string   // its pool label, which a project's pools select by (FunctionNeed.Pools)
}

// FunctionNeed is what one container of a function reserves. GPUModel,
// when set, is matched as a case-insensitive substring of a GPU's model.
type FunctionNeed struct {
	MemoryBytes int64
	MilliCPUs   int64
	GPUs        int
	GPUModel    string
	// Pools, when set, are the only pool labels (FunctionNode.Pool) a node
	// may have to take the function: its app's project's pools.
	Pools []string
}

func (n FunctionNeed) String() string {
	s := fmt.Sprintf("%d MiB", n.MemoryBytes>>20)
	if n.MilliCPUs > 0 {
		s += fmt.Sprintf(", %d mCPU", n.MilliCPUs)
	}
	if n.GPUs > 0 {
		s += fmt.Sprintf(", %d GPUs", n.GPUs)
		if n.GPUModel != "" {
			s += " (" + n.GPUModel + ")"
		}
	}
	return s
}

// fits reports whether one container of need fits the node's share when
// the share is empty: a node that could never hold the function is never
// tried.
func (n FunctionNode) fits(need FunctionNeed) bool {
	if need.MemoryBytes > n.Share.MemoryBytes || need.MilliCPUs > n.Share.MilliCPUs ||
		len(need.Pools) > 0 && !slices.Contains(need.Pools, n.Pool) {
		return false
	}
	if need.GPUs == 0 {
		return true
	}
	matching := 0
	for _, model := range n.GPUModels {
		if need.GPUModel == "" || strings.Contains(strings.ToLower(model), strings.ToLower(need.GPUModel)) {
			matching++
		}
	}
	return matching >= need.GPUs
}

// hrwScore is node's weight for the function.
func hrwScore(fnID, nodeID string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(fnID))
	h.Write([]byte{0})
	h.Write([]byte(nodeID))
	x := h.Sum64()
	// splitmix64's finalizer spreads FNV's weak low bits.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// PlaceFunction returns those of nodes that can hold one container of the
// function (need), in the order its calls try them: highest weight first
// (ties, which need a 64-bit collision, by ID). A call moves ("spills") to
// the next node only when one answers busy. The result is a new slice;
// nodes is not changed.
func PlaceFunction(fnID string, nodes []FunctionNode, need FunctionNeed) []FunctionNode {
	type scored struct {
		n     FunctionNode
		score uint64
	}
	var fit []scored
	for _, n := range nodes {
		if n.fits(need) {
			fit = append(fit, scored{n, hrwScore(fnID, n.ID)})
		}
	}
	slices.SortFunc(fit, func(a, b scored) int {
		return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(a.n.ID, b.n.ID))
	})
	out := make([]FunctionNode, len(fit))
	for i, s := range fit {
		out[i] = s.n
	}
	return out
}
