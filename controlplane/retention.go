package controlplane

import "github.com/mercator/mercator/controlplane/internal/retention"

// RetentionConfig is how long the control plane keeps what it stores and
// what it caps (docs/hardening.md, "Retention"; package retention).
type RetentionConfig = retention.Config

// sweeper is the retention sweep.
func (s *Server) sweeper() *retention.Sweeper {
	return s.cfg.Retention.Sweeper(s.store, retention.Server{PruneAudit: s.audit.Prune, SweepUploads: s.artifacts.SweepUploads,
		Leader: s.leader, Now: s.now, Log: s.log, Swept: func(task string, n int) { s.metrics.Pruned.WithLabelValues(task).Add(float64(n)) }})
}
