// Package capacity checks the placements a control plane recorded against
// the capacity of the nodes they are on: the fleet simulator's over-commit
// check after it killed the scheduling leader (fleetsim/leaderkill.go). A
// second leader placing from a stale view of the fleet would show here as a
// node holding more than it has. It is pure: the caller reads the runs.
package capacity

import (
	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/lifecycle"
)

// Ledger adds up, per node, what the active attempts of the runs it is
// shown ask for. Its zero value is ready to use.
type Ledger struct {
	used map[string]*use
}

type use struct {
	cpu float64
	mem int64
}

// Add counts the run's active attempts (lifecycle.Active) against their
// nodes.
func (l *Ledger) Add(r api.Run) {
	if l.used == nil {
		l.used = map[string]*use{}
	}
	for _, a := range r.Attempts {
		if !lifecycle.Active(a) {
			continue
		}
		u := l.used[a.NodeID]
		if u == nil {
			u = &use{}
			l.used[a.NodeID] = u
		}
		u.cpu += r.CPU
		u.mem += r.MemoryBytes
	}
}

// Over is how many nodes hold more CPU or memory than cpus and memory, a
// node's capacity (every node alike, as in the simulator).
func (l *Ledger) Over(cpus float64, memory int64) int {
	n := 0
	for _, u := range l.used {
		if u.cpu > cpus+1e-9 || u.mem > memory {
			n++
		}
	}
	return n
}
