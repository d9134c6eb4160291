package history

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// LatencyMetric is the functions' latency histogram (package
// controlplane/function), by function ID in the label "fn".
const LatencyMetric = "mercator_fn_call_seconds"

// Tap is a prometheus.Registerer that registers everything with the
// registerer under it and keeps the functions' latency histogram aside, so
// Read gathers that one metric alone (not every series of the process,
// which at ten thousand nodes are hundreds of thousands).
type Tap struct {
	prometheus.Registerer
	own *prometheus.Registry
}

// NewTap wraps under.
func NewTap(under prometheus.Registerer) *Tap {
	return &Tap{Registerer: under, own: prometheus.NewRegistry()}
}

// Register registers c under, and aside too when it is the latency
// histogram.
func (t *Tap) Register(c prometheus.Collector) error {
	if err := t.Registerer.Register(c); err != nil {
		return err
	}
	if describes(c, LatencyMetric) {
		return t.own.Register(c)
	}
	return nil
}

// MustRegister is Register, panicking on an error as Prometheus' does.
func (t *Tap) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := t.Register(c); err != nil {
			panic(err)
		}
	}
}

// describes reports whether c's descriptions name the metric name.
func describes(c prometheus.Collector, name string) bool {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	found := false
	for d := range ch {
		found = found || strings.Contains(d.String(), `fqName: "`+name+`"`)
	}
	return found
}

// Read is the latency histogram of each function, cumulative.
func (t *Tap) Read() (map[string]Histogram, error) {
	fams, err := t.own.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]Histogram{}
	for _, f := range fams {
		if f.GetName() != LatencyMetric {
			continue
		}
		for _, m := range f.GetMetric() {
			var fn string
			for _, l := range m.GetLabel() {
				if l.GetName() == "fn" {
					fn = l.GetValue()
				}
			}
			hist := m.GetHistogram()
			h := Histogram{Count: hist.GetSampleCount()}
			for _, b := range hist.GetBucket() {
				h.Bounds = append(h.Bounds, b.GetUpperBound())
				h.Counts = append(h.Counts, b.GetCumulativeCount())
			}
			out[fn] = h
		}
	}
	return out, nil
}
