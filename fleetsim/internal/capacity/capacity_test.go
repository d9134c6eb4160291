package capacity

import (
	"testing"

	"github.com/mercator/mercator/api"
)

func run(cpu float64, mem int64, attempts ...api.Attempt) api.Run {
	return api.Run{RunSpec: api.RunSpec{CPU: cpu, MemoryBytes: mem}, Attempts: attempts}
}

func on(node, status string) api.Attempt { return api.Attempt{NodeID: node, Status: status} }

// TestLedgerCountsActiveAttemptsOnly: a node is over only by its active
// attempts' requests; ended attempts hold nothing, and an exact fit is not
// over.
func TestLedgerCountsActiveAttemptsOnly(t *testing.T) {
	var l Ledger
	l.Add(run(4, 1<<30, on("a", api.AttemptRunning)))
	l.Add(run(4, 1<<30, on("a", api.AttemptFailed), on("a", api.AttemptPlaced))) // one ended, one placed
	l.Add(run(4, 1<<30, on("b", api.AttemptRunning)))
	if got := l.Over(8, 2<<30); got != 0 {
		t.Fatalf("exact fits counted as %d over-committed nodes, want 0", got)
	}
	l.Add(run(0.5, 0, on("a", api.AttemptUnknown))) // on an unreachable node: still held
	if got := l.Over(8, 2<<30); got != 1 {
		t.Fatalf("a node over by 0.5 CPU: %d over-committed, want 1", got)
	}
	l.Add(run(0, 1<<30, on("b", api.AttemptPreparing))) // b at its memory exactly
	if got := l.Over(8, 2<<30); got != 1 {
		t.Fatalf("b filled to its memory exactly: %d over-committed, want 1 (a)", got)
	}
	l.Add(run(0, 1, on("b", api.AttemptRunning)))
	if got := l.Over(8, 2<<30); got != 2 {
		t.Fatalf("b over by one byte of memory: %d over-committed, want 2", got)
	}
}
