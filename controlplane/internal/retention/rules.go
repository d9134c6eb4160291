package retention

import (
	"context"
	"time"

	"github.com/mercator/mercator/store"
)

// Batch sizes of the store's rules: each batch is one transaction. A run's
// batch counts its log chunks too (an agent ships at most about 64 KiB a
// chunk, so 256 is at most about 16 MiB of log deleted per transaction).
const (
	runBatch    = 256
	recordBatch = 1000
	eventBatch  = 5000
)

// StoreTasks is every retention rule of st as a sweep task. Every table
// the store keeps has a rule here, or is small and bounded by what an
// operator creates (nodes, tokens, Artifacts, registry credentials, apps,
// functions, triggers), or is pruned by its own owner (the audit log).
func StoreTasks(st store.Store, p Config) []Task {
	rule := func(name string, limit int, prune func(tx store.Tx, now time.Time, limit int) (int, error)) Task {
		return Task{Name: name, Batch: func(ctx context.Context, now time.Time) (int, bool, error) {
			var n int
			err := st.Update(ctx, func(tx store.Tx) error { var err error; n, err = prune(tx, now, limit); return err })
			return n, err == nil && n >= limit, err
		}}
	}
	tasks := []Task{
		// Below the watermark a node declared, a redelivered event is
		// recognised by its sequence (store.Tx.SeeEvent), so its row is
		// no longer needed; see watermark.go.
		rule("events", eventBatch, func(tx store.Tx, _ time.Time, limit int) (int, error) { return tx.PruneEvents(limit) }),
		rule("sessions", recordBatch, func(tx store.Tx, now time.Time, limit int) (int, error) {
			return tx.PruneSessions(now.Add(-p.Auth), limit)
		}),
		rule("invitations", recordBatch, func(tx store.Tx, now time.Time, limit int) (int, error) {
			return tx.PruneInvitations(now.Add(-p.Auth), limit)
		}),
	}
	if p.Runs < 0 {
		return tasks // runs, their logs, operations and calls kept forever
	}
	return append(tasks,
		Task{Name: "runs", Batch: func(ctx context.Context, now time.Time) (int, bool, error) {
			var n int
			var more bool
			err := st.Update(ctx, func(tx store.Tx) error {
				var err error
				n, more, err = tx.PruneRuns(now.Add(-p.Runs), runBatch)
				return err
			})
			return n, more, err
		}},
		rule("operations", recordBatch, func(tx store.Tx, now time.Time, limit int) (int, error) {
			return tx.PruneOperations(now.Add(-p.Runs), limit)
		}),
		rule("calls", recordBatch, func(tx store.Tx, now time.Time, limit int) (int, error) {
			return tx.PruneCalls(now.Add(-p.Runs), limit)
		}),
	)
}
