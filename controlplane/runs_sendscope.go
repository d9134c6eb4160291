package controlplane

import (
	"context"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/placement"
	"github.com/mercator/mercator/controlplane/internal/runsecrets"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// What a launch carries that belongs to its run's project (docs/teams.md):
// the project's registry credential for the image (no other project's),
// and the run's secrets. Both are attached as the launch is sent
// (outbound), and only to a node in the project's pools when the project
// is restricted to some: the scheduler places such a run only there
// (project.Constraints), and this is the defence behind it, should a
// placement ever disagree (a pool label changed since, a bug). A launch
// refused them is sent without: its pull of a private image fails, and
// the agent refuses a launch that lacks its secrets, naming them.
//
// A launch needing neither (no secrets, and no project holds a credential
// for its registry, registry.Service.Held) costs no read; one that needs
// them costs one read of its run, its node and its project.

// attachLaunch attaches to l, being sent to node nodeID, its project's
// registry credential and its run's secrets, as the rules above say.
func (s *Server) attachLaunch(ctx context.Context, nodeID string, l *nodeproto.LaunchWorkloadCommand) {
	needAuth := l.RegistryAuth == "" && s.registries.Held(ctx, l.Image)
	if !needAuth && len(l.SecretNames) == 0 {
		return
	}
	var run store.Run
	var inPools bool
	var pools []string
	err := s.store.View(ctx, func(tx store.Tx) error {
		var err error
		if run, err = tx.GetRun(l.RunID); err != nil {
			return err
		}
		p, err := project.Get(tx, api.ProjectOf(run.Project))
		if err != nil {
			return err
		}
		pools = p.Pools
		if inPools = len(pools) == 0; inPools {
			return nil
		}
		n, err := tx.GetNode(nodeID)
		inPools = err == nil && project.InPools(placement.Labels(n), pools)
		return err
	})
	if err != nil {
		s.log.Error("launch sent without its registry credential and secrets: its run could not be read", "run", l.RunID, "node", nodeID, "err", err)
		return
	}
	if !inPools {
		s.log.Error("launch sent without its registry credential and secrets: the node is outside its project's pools",
			"run", l.RunID, "node", nodeID, "project", api.ProjectOf(run.Project), "pools", pools)
		return
	}
	if needAuth {
		l.RegistryAuth = s.registries.Auth(ctx, run.Project, l.Image)
	}
	runsecrets.Attach(serverKey{s}, s.log, run, l)
}
