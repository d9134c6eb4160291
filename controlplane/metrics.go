package controlplane

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the control plane's Prometheus series. Each Server has its own
// registry, so several servers in one process (tests, `mercator dev`) do not
// collide, and the series are exactly those listed here.
type metrics struct {
	registry *prometheus.Registry
	// events counts node events by outcome: "applied" the first time an
	// (node, event ID) is seen, "duplicate" for every redelivery after.
	events *prometheus.CounterVec
	// refused counts node-protocol calls refused, by reason ("fenced",
	// "unauthorized").
	refused *prometheus.CounterVec
	// placements counts attempts created by the scheduler.
	placements prometheus.Counter
	// terminal counts runs reaching a terminal status, by status.
	terminal *prometheus.CounterVec
	// requests and latency cover the HTTP API, by route pattern and code.
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	sessions prometheus.Gauge
	pending  prometheus.Gauge
	// leader is 1 while this replica runs the scheduler.
	leader prometheus.Gauge
	// leaseLapses counts node reports that arrived more than a lease after
	// the node's previous one: each is a span in which the node was
	// unreachable. It is counted by the replica that received the report,
	// so the sum over replicas is the fleet's.
	leaseLapses prometheus.Counter
	// batchSize is how many callers' transactions each group commit
	// carried (store_commit.go); signalsDropped, signals for other replicas that
	// did not fit the queue (replicas_signal.go).
	batchSize      prometheus.Histogram
	signalsDropped prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_node_events_total",
			Help: "Node events received, by outcome: applied (first delivery) or duplicate (redelivery, not applied again)."}, []string{"outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_node_calls_refused_total",
			Help: "Node-protocol calls refused, by reason (fenced, unauthorized)."}, []string{"reason"}),
		placements: prometheus.NewCounter(prometheus.CounterOpts{Name: "mercator_placements_total", Help: "Attempts created by the scheduler."}),
		terminal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_runs_terminal_total",
			Help: "Runs that reached a terminal status, by status."}, []string{"status"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_http_requests_total",
			Help: "HTTP requests by route and status code."}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mercator_http_request_seconds",
			Help: "HTTP request latency by route (streams count until they end).", Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"route"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mercator_node_sessions", Help: "Open node session streams."}),
		pending:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "mercator_runs_pending", Help: "Queued runs at the last reconcile."}),
		leader:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "mercator_scheduler_leader", Help: "1 while this replica runs the scheduler, else 0."}),
		leaseLapses: prometheus.NewCounter(prometheus.CounterOpts{Name: "mercator_node_lease_lapses_total",
			Help: "Node reports that came more than a lease after the node's previous report (the node was unreachable in between)."}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mercator_store_batch_transactions",
			Help: "Transactions carried by each group commit of two or more.", Buckets: prometheus.ExponentialBuckets(2, 2, 8)}),
		signalsDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "mercator_signals_dropped_total",
			Help: "Signals for other replicas dropped because the queue was full (a delay for whoever waited on them, never a loss of data)."}),
	}
	m.registry.MustRegister(m.events, m.refused, m.placements, m.terminal, m.requests, m.latency, m.sessions, m.pending, m.leader, m.leaseLapses, m.batchSize, m.signalsDropped,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// statusRecorder captures the status code a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// instrument counts and times every request by its route pattern.
func (m *metrics) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(rec, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		m.requests.WithLabelValues(route, http.StatusText(rec.code)).Inc()
		m.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}
