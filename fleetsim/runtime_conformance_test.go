package fleetsim

import (
	"strings"
	"testing"

	"github.com/mercator/mercator/nodeagent/runtimetest"
)

// TestRuntimeConformance runs the Runtime conformance suite against the
// simulator's runtime, so the fleet's figures come from agents driving a
// runtime that refuses and adopts what the Docker runtime does. It reads
// no logs, so the suite's log case is skipped for it, as the suite does
// for any runtime that is not a LogSource.
func TestRuntimeConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Harness {
		rt := NewRuntime("conformance", RuntimeConfig{CPUs: 4, MemoryBytes: 8 << 30}, nil)
		return runtimetest.Harness{Runtime: rt, Image: "registry.example/workload@sha256:" + strings.Repeat("cd", 32)}
	})
}
