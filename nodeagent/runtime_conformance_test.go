package nodeagent_test

import (
	"strings"
	"testing"

	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/nodeagent/runtimetest"
)

// TestMemRuntimeConformance runs the Runtime conformance suite against the
// in-memory runtime the agent's tests use, so that fake cannot drift from
// the Docker runtime: it refuses unpinned images, adopts a redelivered
// launch, and honours the stop's grace period as the daemon does. It reads
// no logs, so the suite's log case is skipped for it, as the suite does
// for any runtime that is not a LogSource.
func TestMemRuntimeConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Harness {
		return runtimetest.Harness{Runtime: nodeagent.NewMemRuntime(), Image: "registry.example/workload@sha256:" + strings.Repeat("cd", 32)}
	})
}
