package retention

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// Config is how long the control plane keeps what it stores, and what it
// caps (controlplane.RetentionConfig). Zero fields take their defaults.
type Config struct {
	// Runs is how long a finished run is kept after it finished, with its
	// attempts' logs, and how long done operations and durable calls are
	// kept after they were created (default 30 days; negative keeps them
	// forever).
	Runs time.Duration
	// Auth is how long an expired session, or a spent or expired
	// invitation, is kept for the record (default 7 days).
	Auth time.Duration
	// Audit is how long audit entries are kept (default 30 days), and
	// AuditMaxRows how many at most (default 1,000,000).
	Audit        time.Duration
	AuditMaxRows int
	// SweepEvery is how often the sweep runs (default 10 minutes).
	SweepEvery time.Duration
	// DefaultLogLimit caps an attempt's log when its run sets no
	// log_limit_bytes (default 100 MiB); MaxLogLimit is the most a run may
	// set (default 1 GiB, and never below DefaultLogLimit).
	DefaultLogLimit int64
	MaxLogLimit     int64
	// MaxUploadSize is the largest Artifact upload a client may declare
	// (default: package artifact's, 1 TiB).
	MaxUploadSize int64
}

// WithDefaults is c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Runs = cmp.Or(c.Runs, 30*24*time.Hour)
	c.Auth = cmp.Or(c.Auth, 7*24*time.Hour)
	c.Audit = cmp.Or(c.Audit, 30*24*time.Hour)
	c.AuditMaxRows = cmp.Or(c.AuditMaxRows, 1_000_000)
	c.SweepEvery = cmp.Or(c.SweepEvery, 10*time.Minute)
	c.DefaultLogLimit = cmp.Or(c.DefaultLogLimit, 100<<20)
	c.MaxLogLimit = max(cmp.Or(c.MaxLogLimit, 1<<30), c.DefaultLogLimit)
	return c
}

// CheckLogLimit refuses a spec asking for a larger log than the control
// plane keeps (c with its defaults).
func (c Config) CheckLogLimit(spec api.RunSpec) error {
	if spec.LogLimitBytes > c.MaxLogLimit {
		return failure.Invalid("log_limit_bytes", "%d bytes is more than this control plane keeps of one attempt's log (at most %d bytes, its --max-log-limit)",
			spec.LogLimitBytes, c.MaxLogLimit)
	}
	return nil
}

// LogLimit is the cap of each of r's attempts' logs: its own, no more than
// the maximum, or the default when it sets none.
func (c Config) LogLimit(r api.Run) int64 {
	if r.LogLimitBytes > 0 {
		return min(r.LogLimitBytes, c.MaxLogLimit)
	}
	return c.DefaultLogLimit
}

// Server is what a control plane gives its sweep beyond the store: the
// audit log's pruning (run on the leader) and its staged uploads' (run on
// every replica, each stages its own), whether it leads, its clock, its
// log, and where the counts go.
type Server struct {
	PruneAudit   func(ctx context.Context) (int, error)
	SweepUploads func() int
	Leader       func() bool
	Now          func() time.Time
	Log          *slog.Logger
	Swept        func(task string, n int)
}

// Sweeper is the control plane's sweep under c (with its defaults): the
// store's rules and the audit log's on the leader, the uploads everywhere.
func (c Config) Sweeper(st store.Store, srv Server) *Sweeper {
	tasks := append(StoreTasks(st, c),
		Task{Name: "audit", Batch: func(ctx context.Context, _ time.Time) (int, bool, error) {
			n, err := srv.PruneAudit(ctx)
			return n, false, err
		}},
		Task{Name: "uploads", Local: true, Batch: func(context.Context, time.Time) (int, bool, error) {
			return srv.SweepUploads(), false, nil
		}})
	return &Sweeper{Every: c.SweepEvery, Now: srv.Now, Leader: srv.Leader, Log: srv.Log, Tasks: tasks, Swept: srv.Swept}
}
