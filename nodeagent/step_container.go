package nodeagent

import (
	"context"

	"github.com/mercator/mercator/nodeproto"
)

// containerStep creates and starts the workload's container, or adopts the
// one a previous delivery of this launch made (the runtime's LaunchWorkload
// contract). It returns once the container exists; the observe loop reports
// how it runs.
type containerStep struct{}

func (containerStep) run(ctx context.Context, rt Runtime, l nodeproto.LaunchWorkloadCommand, _ func(nodeproto.PrepareProgress)) error {
	return rt.LaunchWorkload(ctx, l)
}
