package sqlstore

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/internal/faultproxy"
	"github.com/mercator/mercator/store"
)

// TestPostgresPlacementBench commits chunks of 50 placements the way the
// scheduling leader does (epoch checked, nodes and runs read locked,
// operations and runs written) on PostgreSQL reached through a proxy that
// adds a round-trip time, with the writes held and sent together (held.go)
// and, in the same run, each sent as its own statement, and prints chunks a
// second and the ratio:
//
//	MERCATOR_PG_PLACE_BENCH=1 go test ./store/sqlstore -run TestPostgresPlacementBench -v
//
// MERCATOR_PG_PLACE_RTT sets the added round-trip times (default "0,500us,2ms").
func TestPostgresPlacementBench(t *testing.T) {
	if os.Getenv("MERCATOR_PG_PLACE_BENCH") == "" {
		t.Skip("a benchmark: set MERCATOR_PG_PLACE_BENCH=1 to run it")
	}
	rtts := []time.Duration{0, 500 * time.Microsecond, 2 * time.Millisecond}
	if v := os.Getenv("MERCATOR_PG_PLACE_RTT"); v != "" {
		rtts = nil
		for _, f := range strings.Split(v, ",") {
			d, err := time.ParseDuration(f)
			if err != nil {
				t.Fatalf("MERCATOR_PG_PLACE_RTT: %v", err)
			}
			rtts = append(rtts, d)
		}
	}
	const chunk, chunks = 50, 40
	fmt.Printf("| added round trip | held: chunks/s | each statement: chunks/s | held ×each |\n|---|---|---|---|\n")
	for _, rtt := range rtts {
		var rate [2]float64
		for i, hold := range []bool{true, false} {
			rate[i] = placementChunks(t, rtt, hold, chunk, chunks)
		}
		fmt.Printf("| %v | %.0f | %.0f | %.2f× |\n", rtt, rate[0], rate[1], rate[0]/rate[1])
	}
}

// placementChunks commits chunks of placements on a fresh schema reached
// through a proxy adding rtt, and returns chunks a second.
func placementChunks(t *testing.T, rtt time.Duration, hold bool, chunk, chunks int) float64 {
	t.Helper()
	dsn := postgresDB.fresh(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	u.Host = proxy.Addr()
	s, err := Open(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !hold {
		d := *s.d
		d.holdWrites = false
		s.d = &d
	}
	ctx := t.Context()
	epoch, err := s.Lead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	runs := make([][]store.Run, chunks)
	nodeIDs := make([]string, chunk)
	for i := range nodeIDs {
		nodeIDs[i] = fmt.Sprintf("node-%03d", i)
	}
	err = s.Update(ctx, func(tx store.Tx) error {
		for _, id := range nodeIDs {
			if err := tx.PutNode(store.Node{ID: id}); err != nil {
				return err
			}
		}
		for c := range runs {
			for i := 0; i < chunk; i++ {
				runs[c] = append(runs[c], store.Run{Run: api.Run{ID: fmt.Sprintf("run-%03d-%03d", c, i), Status: api.RunQueued, CreatedAt: time.Unix(1, 0).UTC()}})
			}
			if err := tx.CreateRuns(runs[c]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	proxy.SetDelay(rtt / 2) // each way
	start := time.Now()
	for c, batch := range runs {
		err := s.UpdateLocked(ctx, func(tx store.Tx) error {
			if err := tx.CheckEpoch(epoch); err != nil {
				return err
			}
			if _, err := tx.GetNodes(nodeIDs); err != nil {
				return err
			}
			ids := make([]string, len(batch))
			for i, r := range batch {
				ids[i] = r.ID
			}
			if _, err := tx.GetRuns(ids); err != nil {
				return err
			}
			ops := make([]store.Operation, len(batch))
			placed := make([]store.Run, len(batch))
			for i, r := range batch {
				node := nodeIDs[i%len(nodeIDs)]
				ops[i] = store.Operation{ID: fmt.Sprintf("op-%03d-%03d", c, i), NodeID: node, CreatedAt: time.Unix(2, 0).UTC()}
				r.Status = api.RunPlaced
				r.Attempts = []api.Attempt{{Number: 1, NodeID: node}}
				placed[i] = r
			}
			if err := tx.PutOperations(ops); err != nil {
				return err
			}
			return tx.PutRuns(placed)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return float64(len(runs)) / time.Since(start).Seconds()
}
