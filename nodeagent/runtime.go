package nodeagent

import (
	"context"
	"io"

	"github.com/mercator/mercator/nodeproto"
)

// Runtime is the container runtime the agent drives. It is deliberately
// narrow: Docker is the first implementation, and nothing above this line
// knows which one is running, so containerd or another OCI runtime can be
// added without touching the control-plane contract.
//
// Implementations are safe for concurrent use: the agent applies commands,
// observes and reports facts from different goroutines.
type Runtime interface {
	// Facts reports the host, accelerators, driver, runtime, disk, and exact
	// content inventory this machine holds.
	Facts(ctx context.Context) (nodeproto.NodeFacts, error)
	PrepareImage(ctx context.Context, command nodeproto.PrepareImageCommand) error
	PrepareArtifact(ctx context.Context, command nodeproto.PrepareArtifactCommand) error
	// LaunchWorkload starts the container and returns once it is created. The
	// agent observes its lifecycle separately, so a launch that returns does
	// not claim the workload succeeded. The agent calls it last, after
	// PrepareImage and PrepareArtifact for the launch (its prestart steps,
	// launch.go), so it should find both held; one that finds either gone
	// (evicted, removed by hand) prepares it again rather than fail.
	LaunchWorkload(ctx context.Context, command nodeproto.LaunchWorkloadCommand) error
	StopWorkload(ctx context.Context, command nodeproto.StopWorkloadCommand) error
	// Observe reports every workload this runtime currently knows about,
	// including recently exited ones the agent has not yet reported.
	Observe(ctx context.Context) ([]nodeproto.WorkloadObservation, error)
}

// ImageProgress is an optional Runtime extension: PrepareImage telling how
// its pull goes (report is called with the bytes downloaded and the bytes
// known in all, possibly often; the agent rate-limits what it reports). A
// runtime without it prepares images silently, and the agent reports only
// that the launch is preparing.
type ImageProgress interface {
	PrepareImageProgress(ctx context.Context, command nodeproto.PrepareImageCommand, report func(done, total int64)) error
}

// LogSource is the optional part of a Runtime that can read a workload's
// output. It is separate from Runtime because output is a convenience the
// control plane can live without, while the six methods above are what a
// node cannot work without; a runtime that cannot read logs is still a
// runtime, and the agent checks for this interface rather than requiring it.
type LogSource interface {
	// Logs returns the workload's stdout and stderr combined into one
	// stream, in the order the runtime recorded them, from the beginning.
	// With follow, the stream stays open while the workload runs and ends
	// with io.EOF once it has exited and everything was read; without it,
	// the stream ends at what was recorded so far. Any other read error
	// means the stream broke and did not deliver everything. Following a
	// workload that has not started yet is an error (failure.Unavailable),
	// never an empty stream: an empty stream would claim it had exited.
	//
	// The caller owns the returned reader and must Close it; closing it
	// early releases the runtime's side. A workload this runtime does not
	// know is an error matching failure.ErrNotFound.
	Logs(ctx context.Context, key nodeproto.WorkloadKey, follow bool) (io.ReadCloser, error)
}

// ChangeSource is an optional Runtime extension: a signal that something
// about the runtime's workloads changed (a container started, died, was
// OOM-killed or removed). The agent reads Observe again at each signal
// instead of waiting for its next tick, which is what makes an exit reach
// the control plane in milliseconds rather than within an observe period.
// Signals carry no data: Observe stays the one authority on what is true.
type ChangeSource interface {
	// Changes returns a channel that receives a value after each change.
	// Signals may be coalesced; the channel is closed when ctx ends. A
	// broken event stream is reopened by the implementation.
	Changes(ctx context.Context) <-chan struct{}
}
