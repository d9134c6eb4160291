package factcheck

import (
	"context"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// TestQuarantineLifecycle follows one card: reported sick, it is
// quarantined once (the repeated report quarantines nothing new), stays
// quarantined when the node later finds it well, is returned by Uncordon,
// is not quarantined again for the sickness seen before that, and is for a
// later one. Cordon withholds a healthy card; both name a card the node
// lists or are not found.
func TestQuarantineLifecycle(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	a, b := "GPU-00000000-0000-1111-2222-333344445555", "GPU-11111111-0000-1111-2222-333344445555"
	report := func(at time.Time, health ...nodeproto.GPUHealth) (Outcome, store.Node) {
		t.Helper()
		var o Outcome
		var n store.Node
		if err := st.Update(ctx, func(tx store.Tx) error {
			var err error
			if o, err = Apply(tx, "n", &nodeproto.NodeFacts{CPUs: 8, MemoryBytes: 64 << 30, Accelerators: []nodeproto.Accelerator{h100(a), h100(b)}, GPUHealth: health}, at); err != nil {
				return err
			}
			n, err = tx.GetNode("n")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return o, n
	}
	if err := st.Update(ctx, func(tx store.Tx) error { return tx.PutNode(store.Node{ID: "n", CreatedAt: t0, EnrolledAt: &t0}) }); err != nil {
		t.Fatal(err)
	}
	healthy := nodeproto.GPUHealth{UUID: a, State: nodeproto.GPUHealthy, Since: t0}
	lost := nodeproto.GPUHealth{UUID: a, State: nodeproto.GPUSick, Reason: nodeproto.GPUReasonLost, Detail: "GPU is lost", Since: t0.Add(time.Minute)}

	o, n := report(t0.Add(time.Minute), lost)
	if len(o.Quarantined) != 1 || o.Quarantined[0].UUID != a || o.Quarantined[0].Reason != nodeproto.GPUReasonLost {
		t.Fatalf("quarantined %+v", o.Quarantined)
	}
	if w := Withheld(n); w[a] != api.NodeFlagGPUUnhealthy || w[b] != "" {
		t.Fatalf("withheld %v", w)
	}
	gpus := GPUs(n)
	if gpus[0].State != api.GPUStateSick || gpus[0].Reason != nodeproto.GPUReasonLost || gpus[0].Detail != "GPU is lost" || !gpus[0].Since.Equal(lost.Since) || gpus[1].State != api.GPUStateHealthy {
		t.Fatalf("GPUs %+v", gpus)
	}
	if o, _ := report(t0.Add(2*time.Minute), lost); len(o.Quarantined) != 0 {
		t.Fatalf("the same sickness quarantined again: %+v", o.Quarantined)
	}
	if _, n = report(t0.Add(3*time.Minute), healthy); Withheld(n)[a] == "" {
		t.Fatal("a card that reads well again came back without an operator")
	}

	if err := st.Update(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode("n")
		if err != nil {
			return err
		}
		if err := Uncordon(&n, "GPU-not-listed", t0); err == nil {
			t.Error("uncordoning a GPU the node does not list succeeded")
		}
		if err := Uncordon(&n, a, t0.Add(4*time.Minute)); err != nil {
			return err
		}
		if err := Cordon(&n, b, t0.Add(4*time.Minute)); err != nil {
			return err
		}
		return tx.PutNode(n)
	}); err != nil {
		t.Fatal(err)
	}
	o, n = report(t0.Add(5*time.Minute), lost)
	if len(o.Quarantined) != 0 || Withheld(n)[a] != "" {
		t.Fatalf("a sickness seen before the uncordon came back: %+v, withheld %v", o.Quarantined, Withheld(n))
	}
	if w := Withheld(n); w[b] != api.NodeFlagGPUCordoned || len(w) != 1 {
		t.Fatalf("withheld %v", w)
	}
	again := lost
	again.Since = t0.Add(6 * time.Minute)
	if o, n = report(t0.Add(6*time.Minute), again); len(o.Quarantined) != 1 || len(Withheld(n)) != 2 {
		t.Fatalf("a later sickness: quarantined %+v, withheld %v", o.Quarantined, Withheld(n))
	}
}

// TestNewAppXids: a report's application Xids are new once; fatal and other
// ones are not the attempt's.
func TestNewAppXids(t *testing.T) {
	at := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	h := nodeproto.GPUHealth{UUID: "GPU-a", State: nodeproto.GPUHealthy, XIDs: []nodeproto.GPUXid{
		{Xid: 13, Class: nodeproto.XidClassApplication, At: at}, {Xid: 109, Class: nodeproto.XidClassOther, At: at}}}
	first := &nodeproto.NodeFacts{GPUHealth: []nodeproto.GPUHealth{h}}
	if got := newAppXids(nil, first); len(got) != 1 || got[0].GPU != "GPU-a" || got[0].Xid != 13 {
		t.Fatalf("first report: %+v", got)
	}
	h.XIDs = append(h.XIDs, nodeproto.GPUXid{Xid: 31, Class: nodeproto.XidClassApplication, At: at.Add(time.Second)})
	if got := newAppXids(first, &nodeproto.NodeFacts{GPUHealth: []nodeproto.GPUHealth{h}}); len(got) != 1 || got[0].Xid != 31 {
		t.Fatalf("second report: %+v, want only the new Xid 31", got)
	}
}
