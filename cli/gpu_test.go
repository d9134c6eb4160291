package cli

import (
	"testing"

	"github.com/mercator/mercator/api"
)

// TestGPUCount: node ls counts usable of listed GPUs and says so when none
// may be placed on.
func TestGPUCount(t *testing.T) {
	healthy, sick := api.NodeGPU{State: api.GPUStateHealthy}, api.NodeGPU{State: api.GPUStateSick}
	for _, tc := range []struct {
		gpus []api.NodeGPU
		want string
	}{
		{nil, "0"},
		{[]api.NodeGPU{healthy, sick}, "1/2"},
		{[]api.NodeGPU{sick, {State: api.GPUStateCordoned}}, "0/2 ALL WITHHELD"},
	} {
		if got := gpuCount(tc.gpus); got != tc.want {
			t.Errorf("gpuCount(%v) = %q, want %q", tc.gpus, got, tc.want)
		}
	}
}
