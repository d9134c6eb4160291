package liveness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mercator/mercator/internal/pgtest"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/sqlstore"
)

// BenchmarkFlush10k measures one flush of 10,000 heard nodes (8-GPU
// records, as an H100 fleet's are) on SQLite and, with
// MERCATOR_TEST_POSTGRES, PostgreSQL, and beside it, in the same run, the
// write it replaced: each node's record read, decoded, given the moment,
// encoded and written back. It reports both per node and their ratio.
func BenchmarkFlush10k(b *testing.B) {
	b.Run("sqlite", func(b *testing.B) { benchFlush(b, "sqlite://"+filepath.Join(b.TempDir(), "m.db")) })
	if os.Getenv(pgtest.Env) != "" {
		b.Run("postgres", func(b *testing.B) { benchFlush(b, pgtest.FreshSchema(b)) })
	}
}

func benchFlush(b *testing.B, dsn string) {
	const nodes = 10_000
	ctx := context.Background()
	st, err := sqlstore.Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ids := make([]string, nodes)
	if err := st.Update(ctx, func(tx store.Tx) error {
		for i := range ids {
			ids[i] = fmt.Sprintf("gpu-%05d", i)
			n := store.Node{ID: ids[i], CreatedAt: t0, LastSeenAt: &t0, Facts: &nodeproto.NodeFacts{Hostname: ids[i], CPUs: 192, MemoryBytes: 2 << 40}}
			for g := range 8 {
				n.Facts.Accelerators = append(n.Facts.Accelerators, nodeproto.Accelerator{Vendor: "nvidia", Model: "NVIDIA H100 80GB HBM3", UUID: fmt.Sprintf("GPU-%s-%d", ids[i], g), MemoryBytes: 80 << 30})
			}
			if err := tx.PutNode(n); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	r := newReplica(st, 30*time.Second)
	at := t0
	narrow := timeFlushes(b, func() {
		at = at.Add(time.Second)
		for _, id := range ids {
			r.Report(id, at)
		}
		r.flush()
	})
	wide := timeFlushes(b, func() {
		at = at.Add(time.Second)
		for start := 0; start < len(ids); start += livenessChunk {
			if err := st.Update(ctx, func(tx store.Tx) error {
				for _, id := range ids[start:min(start+livenessChunk, len(ids))] {
					n, err := tx.GetNode(id)
					if err != nil {
						return err
					}
					n.LastSeenAt = &at
					if err := tx.PutNode(n); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(narrow.Nanoseconds())/nodes/1e3, "µs/node")
	b.ReportMetric(float64(wide.Nanoseconds())/nodes/1e3, "record-rewrite-µs/node")
	b.ReportMetric(float64(narrow)/float64(wide), "ratio")
}

// timeFlushes runs flush b.N times and returns the mean time of one.
func timeFlushes(b *testing.B, flush func()) time.Duration {
	start := time.Now()
	for range b.N {
		flush()
	}
	return time.Since(start) / time.Duration(b.N)
}
