package factcheck

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/internal/pgtest"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/sqlstore"
)

// TestConcurrentClaimsAreDisputedOnPostgres holds Apply to what ClaimsGPUs
// promises: committed through store.Update, two nodes that first claim
// one GPU at the same moment, each in its own transaction, both end up
// disputing it, on PostgreSQL, whose concurrent writers are where a claim
// could be missed. Each round is a fresh pair of nodes and a fresh UUID.
func TestConcurrentClaimsAreDisputedOnPostgres(t *testing.T) {
	ctx := context.Background()
	st, err := sqlstore.Open(ctx, pgtest.FreshSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	const rounds = 20
	for round := range rounds {
		ids := []string{fmt.Sprintf("a%d", round), fmt.Sprintf("b%d", round)}
		if err := st.Update(ctx, func(tx store.Tx) error {
			for _, id := range ids {
				if err := tx.PutNode(store.Node{ID: id, CreatedAt: now, EnrolledAt: &now}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		uuid := fmt.Sprintf("GPU-%08x-0000-1111-2222-333344445555", round)
		var wg sync.WaitGroup
		errs := make([]error, len(ids))
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = st.Update(ctx, func(tx store.Tx) error {
					_, err := Apply(tx, id, &nodeproto.NodeFacts{CPUs: 8, MemoryBytes: 64 << 30, Accelerators: []nodeproto.Accelerator{h100(uuid)}}, now)
					return err
				})
			}()
		}
		wg.Wait()
		for i, id := range ids {
			if errs[i] != nil {
				t.Fatalf("round %d, node %s: %v", round, id, errs[i])
			}
			var n store.Node
			if err := st.View(ctx, func(tx store.Tx) error { n, err = tx.GetNode(id); return err }); err != nil {
				t.Fatal(err)
			}
			if !Disputed(n)[uuid] {
				t.Fatalf("round %d: node %s does not dispute %s though the other node claimed it at the same moment: %+v", round, id, uuid, n.Flags)
			}
			if !Has(n, api.NodeFlagGPUDisputed) {
				t.Fatalf("round %d: node %s has no dispute flag", round, id)
			}
		}
	}
}
