package lifecycle

import (
	"fmt"
	"slices"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

// maxExcusedGPUFailures bounds how many attempts ended by a bad GPU a run
// is retried for without spending its retry budget. Each such failure
// quarantines a card, so the bound is only reached by a run that meets
// that many bad cards in a row, which says more about the run (or the
// fleet) than about bad luck: past it, GPU failures spend the budget as any
// other failure does.
const maxExcusedGPUFailures = 16

// GPUFailed ends an active attempt because a GPU it holds went bad (the
// node reported it sick: uuid and reason): the attempt fails with a typed
// Failure (api.AttemptFailureGPU), and the run is retried, elsewhere, since
// the card is quarantined, without spending its retry budget. It returns
// whether the attempt was ended here; the caller stops its container. An
// attempt that is not active, or not on nodeID, is left alone.
func GPUFailed(r *api.Run, nodeID string, attempt int, uuid, reason, detail string, now time.Time) bool {
	a := Find(r, attempt)
	if a == nil || a.NodeID != nodeID || !Active(*a) {
		return false
	}
	a.Status = api.AttemptFailed
	a.Error = fmt.Sprintf("%s: GPU %s %s (%s)", api.AttemptFailureGPU, uuid, reason, detail)
	a.Failure = &api.AttemptFailure{Kind: api.AttemptFailureGPU, GPU: uuid, Reason: reason}
	t := now
	a.FinishedAt = &t
	settle(r, a, now)
	r.UpdatedAt = now
	return true
}

// spentAttempts is how many of the run's attempts count against its retry
// budget: all of them but those ended by a bad GPU (up to
// maxExcusedGPUFailures of those).
func spentAttempts(r *api.Run) int {
	excused := 0
	for _, a := range r.Attempts {
		if a.Failure != nil && a.Failure.Kind == api.AttemptFailureGPU && excused < maxExcusedGPUFailures {
			excused++
		}
	}
	return len(r.Attempts) - excused
}

// recordUsage keeps the GPU usage summary an observation carries, when it
// carries one.
func recordUsage(a *api.Attempt, usage []nodeproto.GPUUsage) {
	if len(usage) == 0 {
		return
	}
	a.GPUUsage = make([]api.GPUUsage, len(usage))
	for i, u := range usage {
		a.GPUUsage[i] = api.GPUUsage{UUID: u.UUID, Samples: u.Samples, UtilAvg: u.UtilAvg, UtilPeak: u.UtilPeak, UtilLast: u.UtilLast,
			MemoryAvgMiB: u.MemoryAvgMiB, MemoryPeakMiB: u.MemoryPeakMiB, MemoryLastMiB: u.MemoryLastMiB,
			PowerAvgW: u.PowerAvgW, PowerPeakW: u.PowerPeakW, PowerLastW: u.PowerLastW,
			LongestIdleSec: u.LongestIdleSec, Idle: time.Duration(u.LongestIdleSec)*time.Second >= api.GPUIdleFlagAfter, Through: u.Through}
	}
}

// sameUsage reports whether two summaries count the same samples through
// the same moments (their figures follow from that).
func sameUsage(x, y []api.GPUUsage) bool {
	return slices.EqualFunc(x, y, func(a, b api.GPUUsage) bool {
		return a.UUID == b.UUID && a.Samples == b.Samples && a.Through.Equal(b.Through)
	})
}
