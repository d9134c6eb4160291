package nodeagent

import (
	"context"

	"github.com/mercator/mercator/nodeproto"
)

// artifactsStep makes the runtime hold every Artifact the launch mounts,
// each distinct version once, in the order the launch names them, so a copy
// that cannot be made fails the launch before any container exists. A
// launch without Artifacts asks nothing.
type artifactsStep struct{}

func (artifactsStep) run(ctx context.Context, rt Runtime, l nodeproto.LaunchWorkloadCommand, report func(nodeproto.PrepareProgress)) error {
	if report != nil && len(l.Artifacts) > 0 {
		var total int64
		for _, a := range l.Artifacts {
			total += a.Size
		}
		report(nodeproto.PrepareProgress{Step: nodeproto.ProgressArtifacts, TotalBytes: total})
	}
	seen := map[string]bool{}
	for _, a := range l.Artifacts {
		if seen[a.SHA256] {
			continue
		}
		seen[a.SHA256] = true
		if err := rt.PrepareArtifact(ctx, a.PrepareArtifactCommand); err != nil {
			return err
		}
	}
	return nil
}
