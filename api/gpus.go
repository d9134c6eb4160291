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

// NodeGPUList is the body of GET /v1/nodes/{id}/gpus.
type NodeGPUList struct {
	GPUs []NodeGPU `json:"gpus"`
}
