package controlplane

import (
	"context"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
)

// TestNodeUnreachableOnlyAfterLeaseAndGrace: a node is judged on the
// freshest report known (this replica's memory or the record another
// replica flushed), and is unreachable only once nothing was heard for
// Lease plus the liveness grace: an expiry may be late by the grace,
// never early (package liveness).
func TestNodeUnreachableOnlyAfterLeaseAndGrace(t *testing.T) {
	f := newProtoFixture(t)
	f.enroll(t, "n1", f.invite(t, "n1"))
	heard := f.clock.Now() // the enrollment is a report
	limit := f.srv.cfg.Lease + f.srv.live.Grace()
	if f.srv.live.Grace() <= 0 {
		t.Fatal("no grace: the test proves nothing")
	}
	status := func() string {
		t.Helper()
		var n store.Node
		if err := f.st.View(context.Background(), func(tx store.Tx) error {
			var err error
			n, err = tx.GetNode("n1")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return f.srv.nodeStatus(n)
	}
	f.clock.Advance(f.srv.cfg.Lease + time.Nanosecond)
	if got := status(); got != api.NodeReady {
		t.Fatalf("just past the lease, within the grace: %s, want ready", got)
	}
	f.clock.Advance(limit - f.srv.cfg.Lease - time.Nanosecond)
	if got := status(); got != api.NodeReady {
		t.Fatalf("at lease + grace: %s, want ready", got)
	}
	f.clock.Advance(time.Nanosecond)
	if got := status(); got != api.NodeUnreachable {
		t.Fatalf("past lease + grace: %s, want unreachable", got)
	}
	// Another replica heard the node and flushed it to the record: this
	// replica, whose memory is older, judges on the record.
	later := heard.Add(limit)
	if err := f.st.Update(context.Background(), func(tx store.Tx) error {
		n, err := tx.GetNode("n1")
		if err != nil {
			return err
		}
		n.LastSeenAt = &later
		return tx.PutNode(n)
	}); err != nil {
		t.Fatal(err)
	}
	if got := status(); got != api.NodeReady {
		t.Fatalf("after another replica's report: %s, want ready", got)
	}
}
