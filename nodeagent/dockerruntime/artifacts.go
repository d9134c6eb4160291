package dockerruntime

import (
	"context"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/mercator/mercator/artifactcache"
	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/nodeproto"
)

// WithArtifactOptions sets how Artifact copies are kept (see
// artifactcache.Options). It has effect only with WithArtifactRoot.
func WithArtifactOptions(o artifactcache.Options) Option {
	return func(docker *Runtime) { docker.artifactOpts = o }
}

// artifactsInUse lists the digests mounted by this node's containers that
// exist and have not exited: a created container will mount its copies when
// it starts, and a running one reads them.
func (docker *Runtime) artifactsInUse(ctx context.Context) (map[string]bool, error) {
	filter := filters.NewArgs(filters.Arg("label", dockerengine.LabelArtifacts))
	if docker.nodeID != "" {
		filter.Add("label", dockerengine.LabelNode+"="+docker.nodeID)
	}
	list, err := docker.api.ContainerList(ctx, container.ListOptions{All: true, Filters: filter})
	if err != nil {
		return nil, daemonError(err, "list containers that mount artifacts")
	}
	used := map[string]bool{}
	for _, c := range list {
		if c.State == container.StateExited || c.State == container.StateDead {
			continue
		}
		for _, d := range strings.Split(c.Labels[dockerengine.LabelArtifacts], ",") {
			if d != "" {
				used[d] = true
			}
		}
	}
	return used, nil
}

// PrepareArtifact replicates one immutable version onto this machine,
// through the location the control plane minted for this one fetch and
// nowhere else; a command without one is refused. See
// artifactcache.Cache.Prepare for the whole contract.
func (docker *Runtime) PrepareArtifact(ctx context.Context, command nodeproto.PrepareArtifactCommand) error {
	return docker.artifacts.Prepare(ctx, command)
}
