package nodeproto

import "time"

// GPU health states. A GPU is Healthy or Sick; a Sick GPU names the first
// reason it was found so (the GPUReason constants).
const (
	GPUHealthy = "healthy"
	GPUSick    = "sick"
)

// Reasons a node's sampler finds a GPU sick, each from its own signal. Each
// one quarantines the card (a control plane places nothing more on it until
// an operator uncordons it); none of them stops the node serving with its
// other GPUs.
const (
	// GPUReasonMissing: listed at enrollment, no longer listed by the
	// vendor tool.
	GPUReasonMissing = "gpu_missing"
	// GPUReasonLost: the vendor tool says the GPU is lost or has fallen off
	// the bus (its message, or exit status 15), or the kernel logged Xid 79.
	GPUReasonLost = "gpu_lost"
	// GPUReasonECC: uncorrectable (double-bit) ECC errors since the driver
	// loaded.
	GPUReasonECC = "ecc_uncorrectable"
	// GPUReasonRetirementPending: a retired memory page awaits a reset.
	GPUReasonRetirementPending = "retirement_pending"
	// GPUReasonRemapPending: a remapped memory row awaits a reset.
	GPUReasonRemapPending = "remap_pending"
	// GPUReasonRemapFailed: the row remapper ran out of spare rows.
	GPUReasonRemapFailed = "remap_failed"
	// GPUReasonXid: the kernel logged an Xid classified fatal for the card.
	GPUReasonXid = "xid_fatal"
	// GPUReasonThrottled: hardware slowdown or thermal throttling held
	// for longer than the sampler's sustain period.
	GPUReasonThrottled = "throttled"
	// GPUReasonDiag: an active diagnostic (dcgmi diag) failed the GPU.
	GPUReasonDiag = "diag_failed"
)

// GPUHealth is one GPU's health as the node's sampler last judged it.
// Since is when the GPU entered its present state with its present reason
// (so a report repeating the same sickness carries the same Since, and a
// new sickness a later one); Detail quotes the signal (the tool's line, the
// kernel's Xid line). XIDs lists the most recent Xids the kernel logged for
// the card that were not fatal to it (application faults such as 13, 31,
// 43), newest last, at most MaxGPUXids: those are the workload's failure,
// recorded against the attempt that held the card, not against the card.
type GPUHealth struct {
	UUID   string    `json:"uuid"`
	State  string    `json:"state"`
	Reason string    `json:"reason,omitempty"`
	Detail string    `json:"detail,omitempty"`
	Since  time.Time `json:"since"`
	XIDs   []GPUXid  `json:"xids,omitempty"`
}

// GPUXid is one Xid the kernel logged for a GPU: its number, the class the
// sampler put it in ("fatal", "application" or "other"), when the sampler
// read it and the kernel's line.
type GPUXid struct {
	Xid    int       `json:"xid"`
	Class  string    `json:"class"`
	At     time.Time `json:"at"`
	Detail string    `json:"detail,omitempty"`
}

// Xid classes (GPUXid.Class): what an Xid says about the card.
const (
	XidClassFatal       = "fatal"       // the card is not to be trusted until reset: quarantine
	XidClassApplication = "application" // the workload faulted: recorded against its attempt
	XidClassOther       = "other"       // neither: recorded, nothing done
)

// MaxGPUXids bounds the Xids one GPUHealth carries.
const MaxGPUXids = 8

// GPUUsage summarises one GPU's use by one workload, from the agent's GPU
// samples while the workload ran: how many samples, the average and peak
// of utilization (percent), memory used (MiB) and power (W), the last
// sample's utilization, memory and power (for a fleet's live metrics), and
// the longest stretch the GPU sat idle (utilization under one percent) in
// whole seconds. Through is the moment of the last sample counted. A figure
// the tool did not state is left out of its averages (and is -1 when no
// sample stated it).
type GPUUsage struct {
	UUID           string    `json:"uuid"`
	Samples        int       `json:"samples"`
	UtilAvg        float64   `json:"util_avg"`
	UtilPeak       float64   `json:"util_peak"`
	UtilLast       float64   `json:"util_last"`
	MemoryAvgMiB   float64   `json:"memory_avg_mib"`
	MemoryPeakMiB  float64   `json:"memory_peak_mib"`
	MemoryLastMiB  float64   `json:"memory_last_mib"`
	PowerAvgW      float64   `json:"power_avg_w"`
	PowerPeakW     float64   `json:"power_peak_w"`
	PowerLastW     float64   `json:"power_last_w"`
	LongestIdleSec int64     `json:"longest_idle_s"`
	Through        time.Time `json:"through"`
}

// sameUsage reports whether two summaries were taken through the same
// moments (their figures follow from that).
func sameUsage(a, b []GPUUsage) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].UUID != b[i].UUID || a[i].Samples != b[i].Samples || !a[i].Through.Equal(b[i].Through) {
			return false
		}
	}
	return true
}
