package hostfacts

// GPU usage per workload: the sampler's figures, summed per workload over
// the GPUs it holds, and published at a slow cadence so a summary does not
// turn every sample into an event.

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// DefaultUsagePublishEvery is how often a running workload's GPU usage
// summary is published (then reported with its observation): once a
// minute is a live enough view for a person and one event per running GPU
// workload per minute for the control plane. A workload's end publishes at
// once.
const DefaultUsagePublishEvery = time.Minute

// idleUtilization is the utilization (percent) under which a GPU counts as
// idle.
const idleUtilization = 1

// UsageTracker sums GPU samples per workload. Workloads are named by the
// caller's key; a workload that is not running is not sampled. Its methods
// are safe to call concurrently. It keeps memory only: an agent that
// restarts starts its workloads' summaries again.
type UsageTracker struct {
	every time.Duration

	mu        sync.Mutex
	workloads map[string]*workloadUsage
}

type workloadUsage struct {
	gpus      []string
	acc       map[string]*usageAcc
	published []nodeproto.GPUUsage
	at        time.Time // when published was taken
	final     bool      // published is the last summary
	seen      bool      // running in the last Running call
}

type usageAcc struct {
	n                         int
	utilN, memN, powerN       int
	util, mem, power          float64
	utilPk, memPk, powerPk    float64
	utilLast, memLast, pwLast float64
	idleSince                 time.Time
	longestIdle               time.Duration
	through                   time.Time
}

// NewUsageTracker returns a tracker publishing every every (0:
// DefaultUsagePublishEvery).
func NewUsageTracker(every time.Duration) *UsageTracker {
	if every <= 0 {
		every = DefaultUsagePublishEvery
	}
	return &UsageTracker{every: every, workloads: map[string]*workloadUsage{}}
}

// Running states which workloads run now and the GPUs each holds, and
// which the runtime still knows at all (present, running or not): a
// workload not running is no longer sampled, and one no longer present is
// forgotten.
func (t *UsageTracker) Running(running map[string][]string, present map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, w := range t.workloads {
		w.seen = false
		if !present[key] {
			delete(t.workloads, key)
		}
	}
	for key, g := range running {
		w := t.workloads[key]
		if w == nil {
			w = &workloadUsage{acc: map[string]*usageAcc{}}
			t.workloads[key] = w
		}
		w.gpus, w.seen = slices.Clone(g), true
	}
}

// Add counts one sample's readings (by UUID) for every running workload's
// GPUs. A GPU that gave no reading is not counted this time.
func (t *UsageTracker) Add(readings map[string]GPUReading, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, w := range t.workloads {
		if !w.seen {
			continue
		}
		for _, uuid := range w.gpus {
			r, ok := readings[uuid]
			if !ok {
				continue
			}
			a := w.acc[uuid]
			if a == nil {
				a = &usageAcc{utilPk: -1, memPk: -1, powerPk: -1}
				w.acc[uuid] = a
			}
			a.add(r, now)
		}
	}
}

func (a *usageAcc) add(r GPUReading, now time.Time) {
	a.n++
	a.through = now
	fold := func(v float64, n *int, sum, peak, last *float64) {
		*last = v
		if v < 0 {
			return
		}
		*n++
		*sum += v
		*peak = math.Max(*peak, v)
	}
	fold(r.UtilizationPct, &a.utilN, &a.util, &a.utilPk, &a.utilLast)
	fold(r.MemoryUsedMiB, &a.memN, &a.mem, &a.memPk, &a.memLast)
	fold(r.PowerWatts, &a.powerN, &a.power, &a.powerPk, &a.pwLast)
	if r.UtilizationPct >= 0 && r.UtilizationPct < idleUtilization {
		if a.idleSince.IsZero() {
			a.idleSince = now
		}
		a.longestIdle = max(a.longestIdle, now.Sub(a.idleSince))
	} else {
		a.idleSince = time.Time{}
	}
}

// Published is the workload's summary as last published, taking a new one
// first when the last is older than the publish period, or when final is
// first set (the workload ended: what it used is complete, and that
// summary is the last). Nil for a workload with no GPU sample.
func (t *UsageTracker) Published(key string, final bool, now time.Time) []nodeproto.GPUUsage {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.workloads[key]
	if w == nil {
		return nil
	}
	if !w.final && (final || w.published == nil || now.Sub(w.at) >= t.every) {
		w.published, w.at, w.final = w.summary(), now, final
	}
	return slices.Clone(w.published)
}

// summary is the workload's usage now, in the order of its GPUs.
func (w *workloadUsage) summary() []nodeproto.GPUUsage {
	var out []nodeproto.GPUUsage
	for _, uuid := range w.gpus {
		a := w.acc[uuid]
		if a == nil {
			continue
		}
		avg := func(sum float64, n int) float64 {
			if n == 0 {
				return -1
			}
			return math.Round(sum/float64(n)*10) / 10
		}
		out = append(out, nodeproto.GPUUsage{UUID: uuid, Samples: a.n,
			UtilAvg: avg(a.util, a.utilN), UtilPeak: a.utilPk, UtilLast: a.utilLast,
			MemoryAvgMiB: avg(a.mem, a.memN), MemoryPeakMiB: a.memPk, MemoryLastMiB: a.memLast,
			PowerAvgW: avg(a.power, a.powerN), PowerPeakW: a.powerPk, PowerLastW: a.pwLast,
			LongestIdleSec: int64(a.longestIdle / time.Second), Through: a.through})
	}
	return out
}
