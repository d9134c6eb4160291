package project

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// BenchmarkReservations: one project's function reservations by node
// (`project get`) over 10,000 nodes, a fifth of them holding function
// containers of 20 projects' 200 functions, beside the sum the scheduler
// already makes over the same nodes each pass (FunctionUses), measured in
// the same run; it reports the ratio.
func BenchmarkReservations(b *testing.B) {
	ctx := context.Background()
	st := memstore.New()
	now := time.Now()
	var fns []string
	err := st.Update(ctx, func(tx store.Tx) error {
		for a := range 40 {
			app := store.App{App: api.App{ID: fmt.Sprintf("app-%02d", a), Name: fmt.Sprintf("app%02d", a), Project: fmt.Sprintf("p%02d", a%20)}}
			if err := tx.CreateApp(app); err != nil {
				return err
			}
			for k := range 5 {
				fn := store.Fn{Fn: api.Fn{ID: fmt.Sprintf("fn-%02d-%d", a, k), Name: fmt.Sprintf("f%d", k), AppID: app.ID, CPU: 0.5, Memory: 256}}
				if err := tx.CreateFn(fn); err != nil {
					return err
				}
				fns = append(fns, fn.ID)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	nodes := make([]store.Node, 10000)
	for i := range nodes {
		nodes[i] = store.Node{ID: fmt.Sprintf("n%05d", i), CreatedAt: now, Facts: &nodeproto.NodeFacts{CPUs: 64}}
		if i%5 == 0 {
			nodes[i].Facts.Functions = &nodeproto.FunctionCapacity{Containers: []nodeproto.FunctionContainers{
				{FnID: fns[i%len(fns)], Idle: 1, Busy: 1}, {FnID: fns[(i/5)%len(fns)], Starting: 1}}}
		}
	}
	per := func(f func()) time.Duration {
		start := time.Now()
		for range b.N {
			f()
		}
		return time.Since(start) / time.Duration(b.N)
	}
	b.ResetTimer()
	got := per(func() {
		if err := st.View(ctx, func(tx store.Tx) error { _, err := Reservations(tx, "p07", nodes); return err }); err != nil {
			b.Fatal(err)
		}
	})
	base := per(func() {
		if _, err := FunctionUses(ctx, st, nodes); err != nil {
			b.Fatal(err)
		}
	})
	b.ReportMetric(float64(got.Microseconds()), "µs/get")
	b.ReportMetric(float64(base.Microseconds()), "µs/pass-sum")
	b.ReportMetric(float64(got)/float64(base), "ratio")
}
