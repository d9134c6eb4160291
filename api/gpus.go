package api

import "time"

// GPU health as the API shows it (docs/gpus.md). A node reports each GPU's
// health (nodeproto.GPUHealth); the control plane keeps, per GPU, whether it
// may be placed on.

// GPU states in NodeGPU.State: a GPU is placed on only when healthy.
const (
	GPUStateHealthy  = "healthy"
	GPUStateSick     = "sick"     // quarantined on the node's report, until uncordoned
	GPUStateCordoned = "cordoned" // an operator withheld it
	GPUStateDisputed = "disputed" // another node claims the same UUID
)

// Flag kinds of GPU quarantine (NodeFlag). Like a dispute, each outlives the
// reports that follow while the node lists the GPU: a card that went bad
// stays withheld until an operator uncordons it (POST
// /v1/nodes/{id}/gpus/{uuid}/uncordon), even if the node then finds it well.
const (
	// NodeFlagGPUUnhealthy: the node reported the GPU sick; Detail is
	// "reason: what was seen", Since when the node first saw it.
	NodeFlagGPUUnhealthy = "gpu_unhealthy"
	// NodeFlagGPUCordoned: an operator withheld the GPU.
	NodeFlagGPUCordoned = "gpu_cordoned"
	// NodeFlagGPUUncordoned: when an operator last returned the GPU to
	// service. A sickness the node saw before that moment is not raised
	// again; a later one is.
	NodeFlagGPUUncordoned = "gpu_uncordoned"
)

// NodeGPU is one GPU of a node with its health: State (GPUState…), the
// Reason it is not healthy (a nodeproto.GPUReason… for a sick one), what
// was seen and since when. Reported is the node's own present word (State of
// its last report, "" when its agent does not sample), which may be healthy
// while State stays sick until an operator uncordons the card.
type NodeGPU struct {
	UUID     string    `json:"uuid"`
	Model    string    `json:"model"`
	State    string    `json:"state"`
	Reason   string    `json:"reason,omitempty"`
	Detail   string    `json:"detail,omitempty"`
	Since    time.Time `json:"since,omitempty"`
	Reported string    `json:"reported,omitempty"`
}

// AttemptFailureGPU is the Kind of an attempt's Failure when the GPU it ran
// on went bad: the attempt is failed and the run retried on another card
// without spending its retry budget.
const AttemptFailureGPU = "gpu_failed"

// AttemptFailure is a typed cause of an attempt's failure, besides its
// Error text: the Kind (AttemptFailureGPU), the GPU concerned and the
// reason it was found bad.
type AttemptFailure struct {
	Kind   string `json:"kind"`
	GPU    string `json:"gpu,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// GPUIdleFlagAfter is how long a GPU of an attempt may sit idle (under one
// percent utilization) in one stretch before the attempt is flagged: a
// reserved card doing nothing for half an hour is the most common waste on
// a shared fleet (a notebook left open, a job stuck on its input).
const GPUIdleFlagAfter = 30 * time.Minute

// GPUUsage is one GPU's use by one attempt, as its node sampled it while
// the attempt ran (docs/gpus.md): how many samples, the average and peak of
// utilization (percent), memory used (MiB) and power (W), the last sample's
// figures, the longest idle stretch in seconds and whether that reached
// GPUIdleFlagAfter (Idle), and when the last sample counted was taken. A
// figure the tool did not state is -1.
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
	Idle           bool      `json:"idle,omitempty"`
	Through        time.Time `json:"through"`
}

// GPUXid is an application Xid the kernel logged for a GPU while an attempt
// held it (13 graphics exception, 31 memory page fault, 43 GPU stopped
// processing, …): the program's fault, filed against the attempt and not
// the card, with when the node read it and the kernel's line.
type GPUXid struct {
	GPU    string    `json:"gpu"`
	Xid    int       `json:"xid"`
	At     time.Time `json:"at"`
	Detail string    `json:"detail,omitempty"`
}
