package project

import (
	"math"
	"time"
)

// History is each project's decayed dominant share of the fleet, what the
// scheduler weighs with its current share in fair share
// (scheduler.Project.History). The reconcile loop alone keeps it; it is
// not safe for concurrent use. The zero value is empty.
type History struct {
	share map[string]float64
	at    time.Time
}

// Of is a project's history; 0 for one never seen.
func (h *History) Of(project string) float64 { return h.share[project] }

// Decay folds the shares a plan leaves into the history: each project's
// history moves towards its current share with the half-life given, so use
// a half-life ago weighs half as much as use now, and a burst fades rather
// than counting for a week.
func (h *History) Decay(shares map[string]float64, now time.Time, halfLife time.Duration) {
	if h.share == nil {
		h.share, h.at = map[string]float64{}, now
	}
	keep := math.Exp2(-now.Sub(h.at).Seconds() / halfLife.Seconds())
	for name, s := range shares {
		h.share[name] = h.share[name]*keep + s*(1-keep)
	}
	h.at = now
}
