package controlplane

import (
	"context"
	"errors"
	"fmt"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/artifact"
	"github.com/mercator/mercator/controlplane/internal/runsecrets"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/scheduler"
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
// will read: a missing version is refused at submit (the user can fix it),
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

// artifactFacts is the scheduler's view of a node's Artifacts: the digests
// it holds, and its link floor (a valid measured reading, else the fleet's
// assumption).
func (s *Server) artifactFacts(sn *scheduler.Node, f *nodeproto.NodeFacts) {
	sn.LinkFloorBPS = scheduler.AssumedLinkBytesPerSecond
	if f == nil {
		return
	}
	if l := f.Link; l != nil && l.BytesPerSecond > 0 && s.now().Before(l.ValidUntil) {
		sn.LinkFloorBPS = l.BytesPerSecond
	}
	if len(f.Artifacts) > 0 {
		sn.Artifacts = make(map[string]bool, len(f.Artifacts))
		for _, a := range f.Artifacts {
			sn.Artifacts[a.SHA256] = true
		}
	}
}

// artifactDemand is the scheduler's view of a run's Artifacts.
func artifactDemand(sr *scheduler.Run, spec api.RunSpec) {
	for _, m := range spec.Artifacts {
		sr.Artifacts = append(sr.Artifacts, m.SHA256)
		sr.MinReadBPS = max(sr.MinReadBPS, m.MinReadBytesPerSecond)
	}
}

// placeArtifacts adds a run's Artifacts to its launch and returns a
// prepare_artifact for every one the node does not report holding, for
// the caller to issue ahead of the launch, so the copies begin as soon as
// the node hears of them. The launch waits for them on the node either way.
func (s *Server) placeArtifacts(tx store.Tx, nodeID string, run store.Run, launch *nodeproto.LaunchWorkloadCommand) ([]nodeproto.Command, error) {
	if len(run.Artifacts) == 0 {
		return nil, nil
	}
	held := map[string]bool{}
	if n, err := tx.GetNode(nodeID); err == nil && n.Facts != nil {
		for _, a := range n.Facts.Artifacts {
			held[a.SHA256] = true
		}
	}
	var prepares []nodeproto.Command
	issued := map[string]bool{}
	for _, m := range run.Artifacts {
		v, err := tx.GetArtifact(m.Name, m.Version)
		if err != nil {
			return nil, fmt.Errorf("run %s: %w", run.ID, err)
		}
		prep := nodeproto.PrepareArtifactCommand{Name: v.Name, Version: v.Version, SHA256: v.SHA256, Size: v.Size, Format: v.Format}
		launch.Artifacts = append(launch.Artifacts, nodeproto.ArtifactMount{PrepareArtifactCommand: prep, MountPath: m.MountPath})
		if held[v.SHA256] || issued[v.SHA256] {
			continue
		}
		issued[v.SHA256] = true
		p := prep
		prepares = append(prepares, nodeproto.Command{Kind: nodeproto.KindPrepareArtifact, PrepareArtifact: &p})
	}
	return prepares, nil
}

// outbound is a stored command as it is sent: every Artifact read minted
// now, for this sending, the image's registry credential attached, and a
// launch's secrets opened and attached (runsecrets.Attach). The stored command
// is not changed, so none of them ever reaches the database. A
// read that cannot be minted is sent without one, which the node refuses in
// Mercator's words rather than fetching anything.
func (s *Server) outbound(ctx context.Context, cmd nodeproto.Command) nodeproto.Command {
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
		if l.RegistryAuth == "" {
			l.RegistryAuth = s.registries.Auth(ctx, l.Image)
		}
		runsecrets.Attach(ctx, s.store, serverKey{s}, s.log, &l)
		cmd.LaunchWorkload = &l
	case cmd.UpgradeAgent != nil: // the release's read (package upgrade)
		c := *cmd.UpgradeAgent
		s.upgrades.Mint(ctx, &c)
		cmd.UpgradeAgent = &c
	case cmd.PrepareImage != nil:
		c := *cmd.PrepareImage
		if c.RegistryAuth == "" {
			c.RegistryAuth = s.registries.Auth(ctx, c.Image)
		}
		cmd.PrepareImage = &c
	}
	return cmd
}
