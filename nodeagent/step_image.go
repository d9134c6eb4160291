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

func (imageStep) run(ctx context.Context, rt Runtime, l nodeproto.LaunchWorkloadCommand, report func(nodeproto.PrepareProgress)) error {
	c := nodeproto.PrepareImageCommand{Image: l.Image, RegistryAuth: l.RegistryAuth}
	var err error
	if p, ok := rt.(ImageProgress); ok && report != nil {
		err = p.PrepareImageProgress(ctx, c, func(done, total int64) {
			report(nodeproto.PrepareProgress{Step: nodeproto.ProgressImage, DoneBytes: done, TotalBytes: total})
		})
	} else {
		err = rt.PrepareImage(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("prepare image: %w", err)
	}
	return nil
}
