package function

import (
	"context"
	"time"

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
	invokes                                     *prometheus.CounterVec
	viaStream, viaSession, viaReplica, viaAgain prometheus.Counter
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
	m.viaStream, m.viaSession = m.invokes.WithLabelValues("answers_stream"), m.invokes.WithLabelValues("session")
	m.viaReplica, m.viaAgain = m.invokes.WithLabelValues("replica"), m.invokes.WithLabelValues("resent")
	if s.cfg.Registry != nil {
		s.cfg.Registry.MustRegister(m.calls, m.latency, m.spills, m.durable, m.invokes, &fnContainers{s: s})
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

// fnContainers is the gauge of function containers by function and state
// (idle, paused, busy, starting), summed over the ready nodes' last facts.
// It is read from the store at each scrape: nodes report it with their
// facts, and a scrape is rare next to calls.
type fnContainers struct{ s *Service }

var fnContainersDesc = prometheus.NewDesc("mercator_fn_containers",
	"Function containers on ready nodes by function and state (idle, paused, busy, starting), as the nodes last reported.",
	[]string{"fn", "state"}, nil)

func (c *fnContainers) Describe(ch chan<- *prometheus.Desc) { ch <- fnContainersDesc }

func (c *fnContainers) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type key struct{ fn, state string }
	sums := map[key]int{}
	// The scheduler's copy of the nodes' records, not a read of every
	// record per scrape: at ten thousand nodes that read was a tenth of a
	// second of the control plane's CPU.
	nodes, _ := c.s.host.Nodes(ctx)
	for _, n := range nodes {
		if !c.s.host.NodeReady(n) || n.Facts == nil || n.Facts.Functions == nil {
			continue
		}
		for _, fc := range n.Facts.Functions.Containers {
			sums[key{fc.FnID, "idle"}] += fc.Idle - fc.Paused
			sums[key{fc.FnID, "paused"}] += fc.Paused
			sums[key{fc.FnID, "busy"}] += fc.Busy
			sums[key{fc.FnID, "starting"}] += fc.Starting
		}
	}
	for k, v := range sums {
		ch <- prometheus.MustNewConstMetric(fnContainersDesc, prometheus.GaugeValue, float64(v), k.fn, k.state)
	}
}
