package history

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRingKeepsTheLastN(t *testing.T) {
	r := NewRing[int](3)
	if got := r.Points(); len(got) != 0 {
		t.Fatalf("empty ring: %v", got)
	}
	for i := 1; i <= 7; i++ {
		r.Add(i)
	}
	if got := fmt.Sprint(r.Points()); got != "[5 6 7]" || r.Len() != 3 {
		t.Fatalf("after 7 adds to a ring of 3: %s (len %d), want [5 6 7]", got, r.Len())
	}
}

func TestFleetSeriesBounded(t *testing.T) {
	r := New()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range Points + 10 {
		r.Fleet(FleetPoint{At: t0.Add(time.Duration(i) * Period), Busy: i})
	}
	pts := r.FleetPoints()
	if len(pts) != Points || pts[0].Busy != 10 || pts[len(pts)-1].Busy != Points+9 {
		t.Fatalf("got %d points from %d to %d; want %d from 10", len(pts), pts[0].Busy, pts[len(pts)-1].Busy, Points)
	}
	if !r.Since().Equal(t0) {
		t.Fatalf("since %v, want %v", r.Since(), t0)
	}
}

// hist is a cumulative histogram over buckets of 1, 2, 4 and 8 s with n
// calls in each.
func hist(n ...uint64) Histogram {
	h := Histogram{Bounds: []float64{1, 2, 4, 8}}
	for _, c := range n {
		h.Count += c
		h.Counts = append(h.Counts, h.Count)
	}
	return h
}

func TestQuantileInterpolatesInsideTheBucket(t *testing.T) {
	h := hist(0, 10, 0, 0) // ten calls between 1 and 2 s
	if got := h.Quantile(0.5); got != 1500*time.Millisecond {
		t.Errorf("p50 = %v, want 1.5s (the middle of the bucket)", got)
	}
	if got := hist(50, 0, 0, 50).Quantile(0.99); got != 7920*time.Millisecond {
		t.Errorf("p99 = %v, want 7.92s", got)
	}
	if got := (Histogram{Bounds: []float64{1}, Counts: []uint64{0}, Count: 4}).Quantile(0.5); got != time.Second {
		t.Errorf("all past the last bound: %v, want the last bound", got)
	}
	if got := (Histogram{}).Quantile(0.5); got != 0 {
		t.Errorf("no calls: %v", got)
	}
}

func TestLatencyPointsFromDifferences(t *testing.T) {
	r := New()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	r.Latency(t0, map[string]Histogram{"a": hist(4, 0, 0, 0)})
	r.Latency(t0.Add(Period), map[string]Histogram{"a": hist(4, 0, 0, 0)}) // no calls: no point
	r.Latency(t0.Add(2*Period), map[string]Histogram{"a": hist(4, 0, 6, 0)})
	pts := r.LatencyPoints("a")
	if len(pts) != 2 || pts[0].Calls != 4 || pts[1].Calls != 6 {
		t.Fatalf("points %+v; want 4 calls then 6", pts)
	}
	if pts[1].P50 < 2*time.Second || pts[1].P50 > 4*time.Second {
		t.Fatalf("second period's p50 %v is outside its calls' bucket (2–4 s)", pts[1].P50)
	}
	// Quiet for a whole window: the series goes; its baseline stays, so
	// it comes back with only the new calls.
	r.Latency(t0.Add(2*Period+Window+time.Second), map[string]Histogram{"a": hist(4, 0, 6, 0)})
	if r.LatencyPoints("a") != nil || r.Tracked() != 0 {
		t.Fatalf("a series quiet for a window was kept")
	}
	r.Latency(t0.Add(3*Period+Window), map[string]Histogram{"a": hist(4, 0, 6, 1)})
	if pts := r.LatencyPoints("a"); len(pts) != 1 || pts[0].Calls != 1 {
		t.Fatalf("after coming back: %+v, want one point of 1 call", pts)
	}
}

func TestLatencySeriesBounded(t *testing.T) {
	r := New()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	r.Latency(t0, map[string]Histogram{"old": hist(1, 0, 0, 0)})
	fresh := map[string]Histogram{}
	for i := range MaxFns {
		fresh[fmt.Sprint("f", i)] = hist(1, 0, 0, 0)
	}
	r.Latency(t0.Add(Period), fresh)
	if r.Tracked() != MaxFns || r.LatencyPoints("old") != nil {
		t.Fatalf("tracked %d (want %d), old kept: %v", r.Tracked(), MaxFns, r.LatencyPoints("old") != nil)
	}
}

func TestTapReadsTheLatencyHistogramAlone(t *testing.T) {
	reg := prometheus.NewRegistry()
	tap := NewTap(reg)
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: LatencyMetric, Buckets: []float64{0.1, 1}}, []string{"fn"})
	other := prometheus.NewCounter(prometheus.CounterOpts{Name: "other_total"})
	tap.MustRegister(lat, other)
	lat.WithLabelValues("f1").Observe(0.05)
	lat.WithLabelValues("f1").Observe(0.5)
	other.Inc()
	got, err := tap.Read()
	if err != nil {
		t.Fatal(err)
	}
	h := got["f1"]
	if len(got) != 1 || h.Count != 2 || fmt.Sprint(h.Counts) != "[1 2]" || fmt.Sprint(h.Bounds) != "[0.1 1]" {
		t.Fatalf("read %+v", got)
	}
	if fams, _ := reg.Gather(); len(fams) != 2 {
		t.Fatalf("the registry under the tap has %d families, want both", len(fams))
	}
}
