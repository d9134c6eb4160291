package history

import (
	"math"
	"time"
)

// Histogram is a cumulative latency histogram as Prometheus keeps one:
// Bounds are the buckets' upper bounds in seconds (ascending, without
// +Inf), Counts the calls at or under each bound, Count all calls.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
}

// Sub is the calls in h and not in prev (an earlier sample of the same
// histogram): the period between them. A histogram that went backwards (a
// restart) counts from zero.
func (h Histogram) Sub(prev Histogram) Histogram {
	if prev.Count > h.Count || len(prev.Counts) != len(h.Counts) {
		return h
	}
	out := Histogram{Bounds: h.Bounds, Counts: make([]uint64, len(h.Counts)), Count: h.Count - prev.Count}
	for i := range h.Counts {
		out.Counts[i] = h.Counts[i] - min(prev.Counts[i], h.Counts[i])
	}
	return out
}

// Quantile estimates the q-quantile (0 < q < 1) as Prometheus'
// histogram_quantile does: it finds the bucket holding the rank and
// interpolates linearly inside it, so the estimate is within that
// bucket's bounds (the functions' buckets double, so within a factor of
// two). A rank past the last bound is the last bound. Zero without calls.
func (h Histogram) Quantile(q float64) time.Duration {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return 0
	}
	rank := q * float64(h.Count)
	lower, below := 0.0, 0.0
	for i, upper := range h.Bounds {
		c := float64(h.Counts[i])
		if c >= rank {
			in := c - below
			frac := 1.0
			if in > 0 {
				frac = (rank - below) / in
			}
			return seconds(lower + (upper-lower)*frac)
		}
		lower, below = upper, c
	}
	return seconds(h.Bounds[len(h.Bounds)-1])
}

func seconds(s float64) time.Duration {
	return time.Duration(math.Round(s * float64(time.Second)))
}
