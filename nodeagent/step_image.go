package nodeagent

import (
	"context"
	"fmt"

	"github.com/mercator/mercator/nodeproto"
)

// imageStep makes the runtime hold the launch's image, pulling it by its
// pinned digest with the launch's registry credential if need be. It is the
// one place a launch prepares its image: the container step finds it held.
type imageStep struct{}

func (imageStep) run(ctx context.Context, rt Runtime, l nodeproto.LaunchWorkloadCommand) error {
	if err := rt.PrepareImage(ctx, nodeproto.PrepareImageCommand{Image: l.Image, RegistryAuth: l.RegistryAuth}); err != nil {
		return fmt.Errorf("prepare image: %w", err)
	}
	return nil
}
