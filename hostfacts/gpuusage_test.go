package hostfacts

import (
	"testing"
	"time"
)

// TestUsageTracker: a running workload's GPUs are summed (average, peak,
// last, longest idle), a GPU it does not hold is not, a summary is
// republished only after the period, the final one at once and for good,
// and a workload the runtime no longer knows is forgotten.
func TestUsageTracker(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	tr := NewUsageTracker(time.Minute)
	tr.Running(map[string][]string{"r/1": {"GPU-a"}}, map[string]bool{"r/1": true})
	reading := func(util, mem, power float64) map[string]GPUReading {
		return map[string]GPUReading{
			"GPU-a": {UUID: "GPU-a", UtilizationPct: util, MemoryUsedMiB: mem, PowerWatts: power},
			"GPU-b": {UUID: "GPU-b", UtilizationPct: 100, MemoryUsedMiB: 1, PowerWatts: 1},
		}
	}
	for i, r := range []map[string]GPUReading{reading(0, 10, 60), reading(0, 10, 60), reading(0, 10, 60), reading(90, 1000, 600), reading(30, 500, -1)} {
		tr.Add(r, t0.Add(time.Duration(i)*10*time.Second))
	}
	got := tr.Published("r/1", false, t0.Add(40*time.Second))
	if len(got) != 1 {
		t.Fatalf("summary %+v, want GPU-a alone", got)
	}
	u := got[0]
	if u.UUID != "GPU-a" || u.Samples != 5 || u.UtilAvg != 24 || u.UtilPeak != 90 || u.UtilLast != 30 ||
		u.MemoryPeakMiB != 1000 || u.PowerAvgW != 195 || u.PowerPeakW != 600 || u.PowerLastW != -1 || u.LongestIdleSec != 20 {
		t.Fatalf("summary %+v", u)
	}
	tr.Add(reading(50, 1, 1), t0.Add(50*time.Second))
	if again := tr.Published("r/1", false, t0.Add(50*time.Second)); again[0].Samples != 5 {
		t.Fatalf("republished within the period: %+v", again)
	}
	if later := tr.Published("r/1", false, t0.Add(100*time.Second)); later[0].Samples != 6 {
		t.Fatalf("not republished after the period: %+v", later)
	}
	tr.Running(nil, map[string]bool{"r/1": true}) // exited
	tr.Add(reading(50, 1, 1), t0.Add(110*time.Second))
	final := tr.Published("r/1", true, t0.Add(110*time.Second))
	if final[0].Samples != 6 {
		t.Fatalf("an exited workload was sampled: %+v", final)
	}
	if still := tr.Published("r/1", false, t0.Add(time.Hour)); still[0].Samples != 6 || !still[0].Through.Equal(final[0].Through) {
		t.Fatalf("the final summary changed: %+v", still)
	}
	tr.Running(nil, nil)
	if gone := tr.Published("r/1", true, t0.Add(time.Hour)); gone != nil {
		t.Fatalf("a forgotten workload still has a summary: %+v", gone)
	}
}
