package controlplane

import (
	"testing"

	"github.com/mercator/mercator/controlplane/internal/signals"
	"github.com/mercator/mercator/store/memstore"
)

// TestLostSignalWakesEveryWaiter: signals.Lost (a signal was dropped on the
// way, which one is not known) wakes every node's session streams, the run
// long polls and the reconcile loop, so that none waits for its timer.
func TestLostSignalWakesEveryWaiter(t *testing.T) {
	s := New(Config{}, memstore.New(), nil, nil)
	a, b := s.nodeBroadcast("node-a").Wait(), s.nodeBroadcast("node-b").Wait()
	runs := s.runs.Wait()
	s.deliver(signals.BatchPrefix + "node:node-c\n" + signals.Lost)
	for name, ch := range map[string]<-chan struct{}{"node-a's streams": a, "node-b's streams": b, "run long polls": runs} {
		select {
		case <-ch:
		default:
			t.Errorf("%s not woken by signals.Lost", name)
		}
	}
	select {
	case <-s.reconcileWake:
	default: // delivered synchronously, into the loop's one-signal buffer
		t.Error("the reconcile loop not woken by signals.Lost")
	}
}
