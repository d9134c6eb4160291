package controlplane

import (
	"testing"

	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
)

// TestReserveFunctionShare: the scheduler counts a node's function share
// as used.
func TestReserveFunctionShare(t *testing.T) {
	sn := scheduler.Node{ID: "n", CPU: 8, MemoryBytes: 32 << 30, UsedGPUs: map[string]bool{}}
	reserveFunctionShare(&sn, &nodeproto.NodeFacts{Functions: &nodeproto.FunctionCapacity{MemoryBytes: 8 << 30, MilliCPUs: 2000, GPUs: []string{"GPU-1"}}})
	if sn.UsedMemory != 8<<30 || sn.UsedCPU != 2 || !sn.UsedGPUs["GPU-1"] {
		t.Errorf("node after the share = %+v", sn)
	}
	reserveFunctionShare(&sn, &nodeproto.NodeFacts{})
	if sn.UsedMemory != 8<<30 {
		t.Errorf("a node without functions reserved %d", sn.UsedMemory-8<<30)
	}
}
