package function

import (
	"time"

	"github.com/mercator/mercator/controlplane/internal/fngauge"
	"github.com/prometheus/client_golang/prometheus"
)

// fnMetrics are the Functions series, registered on the server's registry
// beside its own.
type fnMetrics struct {
	// calls counts calls by function and outcome: "success" or the kind
	// the call ended with (busy, timeout, function_failed, node_lost, …).
	calls *prometheus.CounterVec
	// latency is the time from a call's arrival to its end, by function.
	latency *prometheus.HistogramVec
	// spills counts a node answering busy and the call moving on.
	spills *prometheus.CounterVec
	// durable counts durable calls' events: enqueued, succeeded, failed,
	// retried (delivered again), stale (an outcome dropped because the
	// claim had passed to another dispatcher).
	durable *prometheus.CounterVec
	// invokes counts call attempts' commands by the way they went to
	// their node: down a call answers stream, down the session, through
	// another replica, or sent again down the session after the stream
	// they went down broke.
	invokes *prometheus.CounterVec
}

func newFnMetrics(s *Service) *fnMetrics {
	m := &fnMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_fn_calls_total",
			Help: "Function calls by function and outcome (success, or the kind of error)."}, []string{"fn", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mercator_fn_call_seconds",
			Help:    "Function call latency, arrival to end, through the control plane, by function.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}, []string{"fn"}),
		spills: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_fn_spills_total",
			Help: "Calls passed to the next node because a node answered busy, by function."}, []string{"fn"}),
		durable: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_fn_durable_calls_total",
			Help: "Durable (detached, async) call events by function: enqueued, succeeded, failed, retried, stale."}, []string{"fn", "event"}),
		invokes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_fn_invokes_total",
			Help: "Call attempts' commands by the way they went to their node: answers_stream (down the node's call answers stream), session, replica (through the replica holding the node's session), resent (down the session again after the answers stream broke)."}, []string{"route"}),
	}
	if s.cfg.Registry != nil {
		s.cfg.Registry.MustRegister(m.calls, m.latency, m.spills, m.durable, m.invokes, &fngauge.Containers{Nodes: s.host.Nodes, Ready: s.host.NodeReady})
	}
	return m
}

func (m *fnMetrics) observe(fnID, kind string, d time.Duration) {
	outcome := kind
	if outcome == "" {
		outcome = "success"
	}
	m.calls.WithLabelValues(fnID, outcome).Inc()
	m.latency.WithLabelValues(fnID).Observe(d.Seconds())
}
