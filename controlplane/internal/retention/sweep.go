// Package retention is what the control plane deletes, and what it caps,
// so that nothing it stores grows without end (docs/hardening.md,
// "Retention"): the sweep that runs the retention rules (Sweeper), the
// store's rules as sweep tasks (StoreTasks), the per-attempt log cap
// (AppendCapped), and the event watermarks that let de-duplication rows go
// (Watermarks).
//
// The sweep runs named tasks that each delete what is past its keeping,
// in bounded batches, on a timer.
//
// A batch is one short transaction (the store's Prune methods take a
// limit), so sweeping a large backlog never holds a long delete: a task
// reports whether more may remain, and the sweeper runs it again until it
// does not, checking between batches that the sweep should go on. Tasks
// over the shared database run on the scheduling leader only (the same
// rows swept by every replica would be wasted work and lock contention);
// tasks over what a replica keeps on its own disk (Local) run everywhere.
package retention

import (
	"context"
	"log/slog"
	"time"
)

// Task is one retention rule.
type Task struct {
	// Name names the task in logs and in the Swept callback.
	Name string
	// Local marks a task over this replica's own resources (its disk),
	// which runs whether or not this replica leads.
	Local bool
	// Batch deletes at most one batch of what is past its keeping at now,
	// in its own transaction, and reports how many items it deleted and
	// whether more may remain.
	Batch func(ctx context.Context, now time.Time) (n int, more bool, err error)
}

// maxBatches bounds the batches one task runs in one sweep, so that a
// rule with a backlog larger than that (or one that keeps reporting more)
// cannot starve the others; the next sweep carries on.
const maxBatches = 1000

// Sweeper runs Tasks every Every. Leader, when set, says whether this
// replica leads (nil: it always does, a single replica). Swept, when set,
// is told what each task deleted in a sweep, for a metric.
type Sweeper struct {
	Every  time.Duration
	Now    func() time.Time
	Leader func() bool
	Log    *slog.Logger
	Tasks  []Task
	Swept  func(task string, n int)
}

// Run sweeps every Every until ctx ends, the first time Every after it
// starts: a control plane restarting does not add a sweep's work to its
// start, and a short life (a test's) never prunes what it is checking.
func (s *Sweeper) Run(ctx context.Context) {
	t := time.NewTicker(max(s.Every, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sweep(ctx)
		}
	}
}

// Sweep runs every task that should run here once, to completion (or
// maxBatches), and returns what each deleted. A task that fails is logged
// and left for the next sweep; the others still run.
func (s *Sweeper) Sweep(ctx context.Context) map[string]int {
	leading := s.Leader == nil || s.Leader()
	out := map[string]int{}
	for _, task := range s.Tasks {
		if !task.Local && !leading {
			continue
		}
		total := 0
		for range maxBatches {
			if ctx.Err() != nil {
				return out
			}
			n, more, err := task.Batch(ctx, s.Now())
			total += n
			if err != nil {
				if ctx.Err() == nil {
					s.Log.Warn("retention sweep failed", "task", task.Name, "err", err)
				}
				break
			}
			if !more {
				break
			}
		}
		out[task.Name] = total
		if total > 0 {
			s.Log.Info("retention sweep", "task", task.Name, "deleted", total)
			if s.Swept != nil {
				s.Swept(task.Name, total)
			}
		}
	}
	return out
}
