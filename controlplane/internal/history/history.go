// Package history keeps what the web console draws over time, in this
// replica's memory: the fleet's GPUs busy, idle and sick, the queue's
// depth (on the replica that schedules), and each
// function's call latency (p50, p99) and call count, one point a Period
// for the last Points periods (six hours). Nothing is written to the
// store: a replica that started recently has a short history, and each
// replica's function latencies are of the calls that went through it.
//
// Bounds: every series is a ring of Points points; at most MaxFns
// functions have a series (the one called least recently goes first), and
// a function with no call for a whole window loses its series. So the
// memory held is at most (MaxFns+1) × Points points, under 10 MB.
//
// The control plane samples (Recorder.Fleet, Recorder.Latency) and the
// console reads (Recorder.FleetPoints, Recorder.LatencyPoints); the
// functions' latency histogram is read as Prometheus keeps it (Tap), so
// the package needs no hook in the call path. Only package controlplane
// and its subpackages may import it.
package history

import (
	"sync"
	"time"
)

// Period is how often a point is taken; Points how many a series keeps.
const (
	Period = time.Minute
	Points = 360
	// MaxFns is how many functions have a latency series at once.
	MaxFns = 1000
)

// Window is how far back a series reaches.
const Window = Period * Points

// Ring is a series of at most its capacity points, oldest dropped first.
// The zero value keeps nothing; use NewRing.
type Ring[T any] struct {
	pts   []T
	start int // index of the oldest point once full
	full  bool
}

// NewRing returns a ring that keeps n points.
func NewRing[T any](n int) *Ring[T] { return &Ring[T]{pts: make([]T, 0, n)} }

// Add appends p, dropping the oldest point when the ring is full.
func (r *Ring[T]) Add(p T) {
	if !r.full {
		r.pts = append(r.pts, p)
		r.full = len(r.pts) == cap(r.pts)
		return
	}
	r.pts[r.start] = p
	r.start = (r.start + 1) % len(r.pts)
}

// Points returns a copy of the points, oldest first.
func (r *Ring[T]) Points() []T {
	out := make([]T, 0, len(r.pts))
	out = append(out, r.pts[r.start:]...)
	return append(out, r.pts[:r.start]...)
}

// Len is how many points the ring holds.
func (r *Ring[T]) Len() int { return len(r.pts) }

// FleetPoint is the fleet's GPUs at one moment, counted as the Fleet page
// counts them (package nodepage), and the runs waiting in the queue as the
// scheduler's last pass left them: known (QueueKnown) only on the replica
// that schedules.
type FleetPoint struct {
	At               time.Time
	Busy, Idle, Sick int
	Queued           int
	QueueKnown       bool
}

// LatencyPoint is one function's calls over one period ending At: how
// many ended, and the median and 99th percentile of their latency.
type LatencyPoint struct {
	At       time.Time
	Calls    uint64
	P50, P99 time.Duration
}

// Recorder holds the series. Safe for concurrent use; the zero value is
// not ready, use New.
type Recorder struct {
	mu    sync.Mutex
	since time.Time // the first sample: how far back this replica knows
	fleet *Ring[FleetPoint]
	fns   map[string]*fnSeries
	// prev is each function's cumulative histogram as last sampled, kept
	// for every function Prometheus keeps one for (no more than it holds),
	// so a function whose series was dropped does not come back with all
	// its calls since the start in one period.
	prev map[string]Histogram
}

type fnSeries struct {
	ring *Ring[LatencyPoint]
	last time.Time // the last period with calls
}

// New returns an empty recorder.
func New() *Recorder {
	return &Recorder{fleet: NewRing[FleetPoint](Points), fns: map[string]*fnSeries{}, prev: map[string]Histogram{}}
}

// Fleet records the fleet's GPUs as of p.At.
func (r *Recorder) Fleet(p FleetPoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started(p.At)
	r.fleet.Add(p)
}

func (r *Recorder) started(at time.Time) {
	if r.since.IsZero() {
		r.since = at
	}
}

// Since is when this replica took its first sample (zero: none yet).
func (r *Recorder) Since() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.since
}

// FleetPoints is the fleet's series, oldest first.
func (r *Recorder) FleetPoints() []FleetPoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fleet.Points()
}

// LatencyPoints is function fnID's series, oldest first (nil when it had
// no call through this replica in the window).
func (r *Recorder) LatencyPoints(fnID string) []LatencyPoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.fns[fnID]; s != nil {
		return s.ring.Points()
	}
	return nil
}

// Latency records, for the period ending at, each function's calls from
// its cumulative latency histogram (by function ID, as Prometheus keeps
// it): the difference from the last sample is this period's calls. A
// function with calls gets a point; one without calls for a whole Window
// loses its series; past MaxFns series, the least recently called goes.
func (r *Recorder) Latency(at time.Time, byFn map[string]Histogram) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started(at)
	for id, h := range byFn {
		// A histogram first seen now was made at its first call, since
		// the last sample: all its calls are this period's.
		d := h.Sub(r.prev[id])
		r.prev[id] = h
		if d.Count == 0 {
			continue
		}
		s := r.fns[id]
		if s == nil {
			if len(r.fns) >= MaxFns {
				r.evictOldest()
			}
			s = &fnSeries{ring: NewRing[LatencyPoint](Points)}
			r.fns[id] = s
		}
		s.last = at
		s.ring.Add(LatencyPoint{At: at, Calls: d.Count, P50: d.Quantile(0.5), P99: d.Quantile(0.99)})
	}
	for id, s := range r.fns {
		if at.Sub(s.last) > Window {
			delete(r.fns, id)
		}
	}
}

// evictOldest drops the series called least recently.
func (r *Recorder) evictOldest() {
	var oldest string
	for id, s := range r.fns {
		if oldest == "" || s.last.Before(r.fns[oldest].last) {
			oldest = id
		}
	}
	delete(r.fns, oldest)
}

// Tracked is how many functions have a series.
func (r *Recorder) Tracked() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.fns)
}
