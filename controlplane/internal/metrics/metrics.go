// Package metrics is the control plane's Prometheus series: one registry
// per server, so several servers in one process (tests, `mercator dev`) do
// not collide, and the series are exactly those listed on Set. Only
// package controlplane and its subpackages may import it.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mercator/mercator/nodeproto"
)

// Set is one server's series and the registry that holds them (Functions
// register theirs on Registry too).
type Set struct {
	Registry *prometheus.Registry
	// Events counts node events by outcome: "applied" the first time an
	// (node, event ID) is seen, "duplicate" for every redelivery after.
	Events *prometheus.CounterVec
	// Refused counts node-protocol calls refused, by reason ("fenced",
	// "unauthorized").
	Refused *prometheus.CounterVec
	// Placements counts attempts created by the scheduler.
	Placements prometheus.Counter
	// Terminal counts runs reaching a terminal status, by status.
	Terminal *prometheus.CounterVec
	// Requests and Latency cover the HTTP API, by route pattern and code.
	Requests *prometheus.CounterVec
	Latency  *prometheus.HistogramVec
	// Sessions is the open session streams; Pending, the queued runs at
	// the last reconcile.
	Sessions prometheus.Gauge
	Pending  prometheus.Gauge
	// Leader is 1 while this replica runs the scheduler.
	Leader prometheus.Gauge
	// EpochStarted and EpochFirstPlaced are when this replica's current
	// scheduling epoch began and when its first placement committed (Unix
	// seconds; 0 while it does not lead, or has not placed yet). They say
	// how long a takeover took in the replica's own time, which a scrape
	// arriving late (a replica busy with the fleet that just moved onto
	// it) does not stretch.
	EpochStarted, EpochFirstPlaced prometheus.Gauge
	// LeaseLapses counts node reports that arrived more than a lease after
	// the node's previous one: each is a span in which the node was
	// unreachable. It is counted by the replica that received the report,
	// so the sum over replicas is the fleet's.
	LeaseLapses prometheus.Counter
	// BatchSize is how many callers' transactions each group commit
	// carried; SignalsDropped, signals for other replicas that did not fit
	// the queue.
	BatchSize      prometheus.Histogram
	SignalsDropped prometheus.Counter
	// AuditDropped counts audit entries dropped because the audit queue
	// was full (package httpapi's Auditor).
	AuditDropped prometheus.Counter
	// Pruned counts what the retention sweeps deleted, by task (package
	// controlplane/internal/retention).
	Pruned *prometheus.CounterVec
	// FactFlags counts flags raised on node facts at intake, by kind
	// (api.NodeFlagFactsRefused, …; package controlplane/internal/factcheck): each
	// time a report raises a flag its node did not carry.
	FactFlags *prometheus.CounterVec
	// LoopPanics counts panics recovered in the server's background loops,
	// by loop (package supervise restarts the loop after a backoff).
	LoopPanics *prometheus.CounterVec
	// Throttled counts requests and connections refused by the server's
	// limits (package limits), by reason: "caller" (a credential's, node's
	// or address's requests in flight: 429), "overall" (the server's: 503),
	// "node_bytes" (node bodies in flight: 503), "too_large" (a body over its
	// route's limit: 413), "connections" (the connection cap: closed).
	Throttled *prometheus.CounterVec
	// InFlight is the requests ("requests") and streams ("streams") being
	// served, as package limits counts them.
	InFlight *prometheus.GaugeVec
	// GPUs is how many GPUs of enrolled nodes are in each state (healthy,
	// sick, cordoned, disputed), as of the scheduler's last view.
	GPUs *prometheus.GaugeVec
	// GPUUtilization, GPUMemoryUsed and GPUPower are each busy GPU's last
	// sampled figures, by node and GPU, from the usage summaries attempts
	// report (at most a publish period old); a GPU's series go when its
	// attempt ends.
	GPUUtilization, GPUMemoryUsed, GPUPower *prometheus.GaugeVec
}

// New returns a server's series, registered.
func New() *Set {
	m := &Set{
		Registry: prometheus.NewRegistry(),
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_node_events_total",
			Help: "Node events received, by outcome: applied (first delivery) or duplicate (redelivery, not applied again)."}, []string{"outcome"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_node_calls_refused_total",
			Help: "Node-protocol calls refused, by reason (fenced, unauthorized)."}, []string{"reason"}),
		Placements: prometheus.NewCounter(prometheus.CounterOpts{Name: "mercator_placements_total", Help: "Attempts created by the scheduler."}),
		Terminal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_runs_terminal_total",
			Help: "Runs that reached a terminal status, by status."}, []string{"status"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_http_requests_total",
			Help: "HTTP requests by route and status code."}, []string{"route", "code"}),
		Latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mercator_http_request_seconds",
			Help: "HTTP request latency by route (streams count until they end).", Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"route"}),
		Sessions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mercator_node_sessions", Help: "Open node session streams."}),
		Pending:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "mercator_runs_pending", Help: "Queued runs at the last reconcile."}),
		Leader:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "mercator_scheduler_leader", Help: "1 while this replica runs the scheduler, else 0."}),
		EpochStarted: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mercator_scheduler_epoch_start_timestamp_seconds",
			Help: "When this replica's current scheduling epoch began (Unix seconds); 0 while it does not lead."}),
		EpochFirstPlaced: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mercator_scheduler_epoch_first_placement_timestamp_seconds",
			Help: "When the first placement of this replica's current scheduling epoch committed (Unix seconds); 0 until then, and while it does not lead."}),
		LeaseLapses: prometheus.NewCounter(prometheus.CounterOpts{Name: "mercator_node_lease_lapses_total",
			Help: "Node reports that came more than a lease after the node's previous report (the node was unreachable in between)."}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mercator_store_batch_transactions",
			Help: "Transactions carried by each group commit of two or more.", Buckets: prometheus.ExponentialBuckets(2, 2, 8)}),
		SignalsDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "mercator_signals_dropped_total",
			Help: "Signals for other replicas dropped because the queue was full (a delay for whoever waited on them, never a loss of data)."}),
		AuditDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "mercator_audit_dropped_total",
			Help: "Audit entries dropped because the audit queue was full."}),
		Pruned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_retention_deleted_total",
			Help: "Records the retention sweeps deleted, by task (runs, operations, calls, events, sessions, invitations, audit, uploads)."}, []string{"task"}),
		FactFlags: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_node_fact_flags_total",
			Help: "Flags raised on node facts when a node reported them, by kind (facts_refused, gpu_disputed, gpu_duplicate, gpu_uuid_format, gpu_memory, share_above_capacity, facts_jump)."}, []string{"kind"}),
		LoopPanics: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_loop_panics_total",
			Help: "Panics recovered in background loops, by loop; each loop was restarted after a backoff."}, []string{"loop"}),
		Throttled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mercator_http_throttled_total",
			Help: "Requests and connections refused by the server's limits, by reason (caller, overall, node_bytes, too_large, connections)."}, []string{"reason"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mercator_http_in_flight",
			Help: "Requests and streams being served, by kind (requests, streams)."}, []string{"kind"}),
		GPUs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mercator_gpus",
			Help: "GPUs of enrolled nodes by state (healthy, sick, cordoned, disputed), as of the scheduler's last view."}, []string{"state"}),
		GPUUtilization: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mercator_gpu_utilization_percent",
			Help: "A busy GPU's last sampled utilization, by node and GPU (from its attempt's usage summary)."}, []string{"node", "gpu"}),
		GPUMemoryUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mercator_gpu_memory_used_bytes",
			Help: "A busy GPU's last sampled memory in use, by node and GPU."}, []string{"node", "gpu"}),
		GPUPower: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mercator_gpu_power_watts",
			Help: "A busy GPU's last sampled power draw, by node and GPU."}, []string{"node", "gpu"}),
	}
	m.Registry.MustRegister(m.Events, m.Refused, m.Placements, m.Terminal, m.Requests, m.Latency, m.Sessions, m.Pending, m.Leader, m.EpochStarted, m.EpochFirstPlaced, m.LeaseLapses, m.BatchSize, m.SignalsDropped, m.AuditDropped, m.Pruned, m.FactFlags, m.LoopPanics, m.Throttled, m.InFlight, m.GPUs, m.GPUUtilization, m.GPUMemoryUsed, m.GPUPower,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// LoopPanicked counts a panic recovered in a background loop (package
// supervise's Supervisor.Panicked).
func (m *Set) LoopPanicked(loop string) { m.LoopPanics.WithLabelValues(loop).Inc() }

// Throttle counts a refusal by the server's limits, by reason, and
// AddInFlight follows the requests and streams being served (package
// limits' Observer).
func (m *Set) Throttle(reason string)             { m.Throttled.WithLabelValues(reason).Inc() }
func (m *Set) AddInFlight(kind string, d float64) { m.InFlight.WithLabelValues(kind).Add(d) }

// Handler serves the registry (GET /metrics).
func (m *Set) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
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

// Unwrap lets http.ResponseController reach the connection (per-route
// read and write deadlines, package limits).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Instrument counts and times every request by its route pattern.
func (m *Set) Instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(rec, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		m.Requests.WithLabelValues(route, http.StatusText(rec.code)).Inc()
		m.Latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

// SetGPUStates sets the GPU gauge from a count of GPUs by state.
func (m *Set) SetGPUStates(counts map[string]int) {
	for state, c := range counts {
		m.GPUs.WithLabelValues(state).Set(float64(c))
	}
}

// RecordGPUUsage sets the per-GPU gauges from the usage summaries in a
// batch of one node's events, and drops a GPU's series once its attempt
// ended. A figure the tool did not state (-1) leaves its gauge as it was.
func (m *Set) RecordGPUUsage(nodeID string, batch nodeproto.EventBatch) {
	gauges := []*prometheus.GaugeVec{m.GPUUtilization, m.GPUMemoryUsed, m.GPUPower}
	for _, ev := range batch.Events {
		if ev.Kind != nodeproto.EventWorkload || ev.Workload == nil {
			continue
		}
		for _, u := range ev.Workload.GPUUsage {
			for i, v := range []float64{u.UtilLast, u.MemoryLastMiB * (1 << 20), u.PowerLastW} {
				switch {
				case ev.Workload.Phase != nodeproto.PhaseRunning:
					gauges[i].DeleteLabelValues(nodeID, u.UUID)
				case v >= 0:
					gauges[i].WithLabelValues(nodeID, u.UUID).Set(v)
				}
			}
		}
	}
}
