package controlplane

import (
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
)

// reserveFunctionShare counts the node's function share as used when the
// scheduler places Runs: the memory, CPU and GPUs an agent set aside for
// function containers are never promised to a Run as well.
func reserveFunctionShare(sn *scheduler.Node, f *nodeproto.NodeFacts) {
	if f.Functions == nil {
		return
	}
	sn.UsedMemory += f.Functions.MemoryBytes
	sn.UsedCPU += float64(f.Functions.MilliCPUs) / 1000
	if len(f.Functions.GPUs) > 0 && sn.UsedGPUs == nil {
		sn.UsedGPUs = map[string]bool{} // schedNode leaves it nil
	}
	for _, id := range f.Functions.GPUs {
		sn.UsedGPUs[id] = true
	}
}
