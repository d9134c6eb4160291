package controlplane

import (
	"context"
	"time"

	"github.com/mercator/mercator/controlplane/internal/sweep"
	"github.com/mercator/mercator/store"
)

// Retention: what the control plane deletes, and when (docs/hardening.md,
// "Retention"). Every table the store keeps has a rule here, or is small
// and bounded by what an operator creates (nodes, tokens, Artifacts,
// registry credentials, apps, functions, triggers).
const (
	defaultRunRetention  = 30 * 24 * time.Hour
	defaultAuthRetention = 7 * 24 * time.Hour
	defaultSweepEvery    = 10 * time.Minute
	// DefaultLogLimit and DefaultMaxLogLimit are Config.DefaultLogLimit's
	// and Config.MaxLogLimit's defaults.
	DefaultLogLimit    = 100 << 20
	DefaultMaxLogLimit = 1 << 30
)

// Batch sizes of the sweeps: each is one transaction. A run's batch counts
// its log chunks too (an agent ships at most 64 KiB a chunk, so 256 is at
// most about 16 MiB of log deleted per transaction).
const (
	runBatch    = 256
	recordBatch = 1000
	eventBatch  = 5000
)

func (c *Config) retentionDefaults() {
	if c.RunRetention == 0 {
		c.RunRetention = defaultRunRetention
	}
	if c.AuthRetention == 0 {
		c.AuthRetention = defaultAuthRetention
	}
	if c.SweepEvery == 0 {
		c.SweepEvery = defaultSweepEvery
	}
	if c.DefaultLogLimit == 0 {
		c.DefaultLogLimit = DefaultLogLimit
	}
	if c.MaxLogLimit == 0 {
		c.MaxLogLimit = max(DefaultMaxLogLimit, c.DefaultLogLimit)
	}
	c.DefaultLogLimit = min(c.DefaultLogLimit, c.MaxLogLimit)
}

// sweeper is the retention sweep: the store's rules on the leader, this
// replica's staged uploads everywhere.
func (s *Server) sweeper() *sweep.Sweeper {
	return &sweep.Sweeper{Every: s.cfg.SweepEvery, Now: s.now, Leader: s.leader, Log: s.log, Tasks: s.retentionTasks(),
		Swept: func(task string, n int) { s.metrics.Pruned.WithLabelValues(task).Add(float64(n)) }}
}

// prune makes a sweep task of one store rule that deletes up to limit
// items a transaction; more is reported while a batch comes back full.
func (s *Server) prune(name string, limit int, rule func(tx store.Tx, now time.Time, limit int) (int, error)) sweep.Task {
	return sweep.Task{Name: name, Batch: func(ctx context.Context, now time.Time) (int, bool, error) {
		var n int
		err := s.store.Update(ctx, func(tx store.Tx) error { var err error; n, err = rule(tx, now, limit); return err })
		return n, err == nil && n >= limit, err
	}}
}

func (s *Server) retentionTasks() []sweep.Task {
	runs, auth := s.cfg.RunRetention, s.cfg.AuthRetention
	tasks := []sweep.Task{
		{Name: "audit", Batch: func(ctx context.Context, _ time.Time) (int, bool, error) {
			n, err := s.audit.Prune(ctx)
			return n, false, err
		}},
		// Below the watermark a node declared, a redelivered event is
		// recognised by its sequence (store.Tx.SeeEvent), so its row is
		// no longer needed; see nodes_protocol.go.
		s.prune("events", eventBatch, func(tx store.Tx, _ time.Time, limit int) (int, error) { return tx.PruneEvents(limit) }),
		s.prune("sessions", recordBatch, func(tx store.Tx, now time.Time, limit int) (int, error) {
			return tx.PruneSessions(now.Add(-auth), limit)
		}),
		s.prune("invitations", recordBatch, func(tx store.Tx, now time.Time, limit int) (int, error) {
			return tx.PruneInvitations(now.Add(-auth), limit)
		}),
		{Name: "uploads", Local: true, Batch: func(context.Context, time.Time) (int, bool, error) {
			return s.artifacts.SweepUploads(), false, nil
		}},
	}
	if runs < 0 {
		return tasks // runs, their logs, operations and calls kept forever
	}
	return append(tasks,
		sweep.Task{Name: "runs", Batch: func(ctx context.Context, now time.Time) (int, bool, error) {
			var n int
			var more bool
			err := s.store.Update(ctx, func(tx store.Tx) error {
				var err error
				n, more, err = tx.PruneRuns(now.Add(-runs), runBatch)
				return err
			})
			return n, more, err
		}},
		s.prune("operations", recordBatch, func(tx store.Tx, now time.Time, limit int) (int, error) {
			return tx.PruneOperations(now.Add(-runs), limit)
		}),
		s.prune("calls", recordBatch, func(tx store.Tx, now time.Time, limit int) (int, error) {
			return tx.PruneCalls(now.Add(-runs), limit)
		}),
	)
}
