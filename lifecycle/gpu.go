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

// SickGPU is a GPU its node reported sick: its UUID, the node's reason
// (a nodeproto.GPUReason…) and what the node saw.
type SickGPU struct{ UUID, Reason, Detail string }

// maxAttemptXids bounds the Xids kept on one attempt (the first ones: a
// program that faults once usually faults on every step after).
const maxAttemptXids = 16

// RecordXids files against the run's current attempt, if it is active on
// nodeID, each application Xid the node reported for a GPU the attempt
// holds: the program's fault is the attempt's, not the card's. It returns
// whether any was filed.
func RecordXids(r *api.Run, nodeID string, xids []api.GPUXid) bool {
	a := MemberOn(r, nodeID)
	if a == nil || !Active(*a) {
		return false
	}
	filed := false
	for _, x := range xids {
		if slices.Contains(a.GPUs, x.GPU) && len(a.Xids) < maxAttemptXids {
			a.Xids = append(a.Xids, x)
			filed = true
		}
	}
	return filed
}

// GPUFailed ends the run's current attempt if it is active on nodeID and
// holds one of the sick GPUs: the attempt fails with a typed Failure
// (api.AttemptFailureGPU, the first sick GPU it holds), is marked
// StopRequested (the caller stops its container), and the run is retried,
// elsewhere since the card is quarantined, without spending its retry
// budget. It returns the attempt ended, or nil when none was.
func GPUFailed(r *api.Run, nodeID string, sick []SickGPU, now time.Time) *api.Attempt {
	a := MemberOn(r, nodeID)
	if a == nil || !Active(*a) {
		return nil
	}
	i := slices.IndexFunc(sick, func(g SickGPU) bool { return slices.Contains(a.GPUs, g.UUID) })
	if i < 0 {
		return nil
	}
	g := sick[i]
	a.Status, a.StopRequested = api.AttemptFailed, true
	a.Error = fmt.Sprintf("%s: GPU %s %s (%s)", api.AttemptFailureGPU, g.UUID, g.Reason, g.Detail)
	a.Failure = &api.AttemptFailure{Kind: api.AttemptFailureGPU, GPU: g.UUID, Reason: g.Reason}
	t := now
	a.FinishedAt = &t
	settle(r, a, now)
	r.UpdatedAt = now
	return a
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
