package controlplane

import (
	"context"
	"errors"
	"fmt"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/artifact"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/store"
)

// A run's Artifacts: checked and pinned at submit, seen by the scheduler
// (what nodes hold, what runs need), issued to the node as prepare_artifact
// ahead of the launch, and given a freshly minted read each time a command
// is sent (outbound). The catalog and the content are package artifact's.
//
// Commands carry no minted read in the store. The session stream mints one
// for every prepare (and every launch's Artifacts) as it sends the command
// (outbound), so a redelivered command gets a fresh read, and no stored
// operation holds a credential, however short-lived.

// resolveArtifacts pins every Artifact of a run to the exact version it
// will read: a missing version, or one of another project, is refused at
// submit (the user can fix it),
// an empty one becomes the newest, and the digest is recorded (and, when
// the client stated one, checked).
func (s *Server) resolveArtifacts(ctx context.Context, spec *api.RunSpec) error {
	if len(spec.Artifacts) == 0 {
		return nil
	}
	spec.Artifacts = append([]api.ArtifactMount(nil), spec.Artifacts...)
	return s.store.View(ctx, func(tx store.Tx) error {
		for i := range spec.Artifacts {
			m := &spec.Artifacts[i]
			field := fmt.Sprintf("artifacts[%d]", i)
			v, err := artifact.LookupVersion(tx, m.Name, m.Version)
			if err == nil && api.ProjectOf(v.Project) != spec.Project { // docs/teams.md
				if httpapi.ConfineToProject(ctx, api.ProjectOf(v.Project), "") == nil {
					return failure.Invalid(field, "artifact %s belongs to project %s; a run of project %s mounts only its own project's Artifacts (push it to %s under another name)",
						m.Name, api.ProjectOf(v.Project), spec.Project, spec.Project)
				}
				err = failure.NotFound("artifact", m.Name) // a project the caller may not see: as if absent
			}
			if errors.Is(err, failure.ErrNotFound) {
				ref := m.Name + "@" + m.Version
				if m.Version == "" || m.Version == "latest" {
					ref = m.Name
				}
				return failure.Invalid(field, "artifact %s does not exist; push it with `mercator artifact push %s PATH`, or list what exists with `mercator artifact ls`", ref, m.Name)
			}
			if err != nil {
				return err
			}
			if m.SHA256 != "" && m.SHA256 != v.SHA256 {
				return failure.Invalid(field+".sha256", "artifact %s has content %s, not %s", v.Ref(), v.SHA256, m.SHA256)
			}
			m.Version, m.SHA256 = v.Version, v.SHA256
		}
		return nil
	})
}

// outbound is a stored command as it is sent to node nodeID: every
// Artifact read minted now, for this sending, and a launch's registry
// credential and secrets attached, its project's only and only to a node
// in its project's pools (attachLaunch). The stored command
// is not changed, so none of them ever reaches the database. A
// read that cannot be minted is sent without one, which the node refuses in
// Mercator's words rather than fetching anything.
func (s *Server) outbound(ctx context.Context, nodeID string, cmd nodeproto.Command) nodeproto.Command {
	switch {
	case cmd.PrepareArtifact != nil:
		c := *cmd.PrepareArtifact
		s.artifacts.Mint(ctx, &c)
		cmd.PrepareArtifact = &c
	case cmd.LaunchWorkload != nil:
		l := *cmd.LaunchWorkload
		l.Artifacts = append([]nodeproto.ArtifactMount(nil), l.Artifacts...)
		for i := range l.Artifacts {
			s.artifacts.Mint(ctx, &l.Artifacts[i].PrepareArtifactCommand)
		}
		s.attachLaunch(ctx, nodeID, &l) // runs_sendscope.go
		cmd.LaunchWorkload = &l
	case cmd.UpgradeAgent != nil: // the release's read (package upgrade)
		c := *cmd.UpgradeAgent
		s.upgrades.Mint(ctx, &c)
		cmd.UpgradeAgent = &c
	case cmd.PrepareImage != nil:
		c := *cmd.PrepareImage
		if c.RegistryAuth == "" { // an image of no run: the default project's
			c.RegistryAuth = s.registries.Auth(ctx, api.DefaultProject, c.Image)
		}
		cmd.PrepareImage = &c
	}
	return cmd
}
