package nodeagent

import (
	"fmt"
	"testing"
)

// TestFirstDelivery: a rendezvous is served once, however many sessions
// carry it, and the memory of served ones stays bounded.
func TestFirstDelivery(t *testing.T) {
	f := &agentFunctions{seen: map[string]bool{}}
	if !f.firstDelivery("rv-1") || f.firstDelivery("rv-1") {
		t.Fatal("rv-1 served twice or never")
	}
	for i := 0; i < 3*recentDeliveries; i++ {
		f.firstDelivery(fmt.Sprintf("rv-x%d", i))
	}
	if len(f.seen)+len(f.seenBefore) > 2*recentDeliveries {
		t.Errorf("%d rendezvous remembered", len(f.seen)+len(f.seenBefore))
	}
	if f.firstDelivery(fmt.Sprintf("rv-x%d", 3*recentDeliveries-1)) {
		t.Error("a recent rendezvous was served again")
	}
}
