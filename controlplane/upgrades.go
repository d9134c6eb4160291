package controlplane

import (
	"cmp"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/artifact"
	"github.com/mercator/mercator/controlplane/upgrade"
	"github.com/mercator/mercator/store"
)

// newUpgrades wires agent releases and rollouts (package upgrade) to this
// server: its content store and release key, node readiness, the way
// commands are issued and sessions woken, and leadership.
func (s *Server) newUpgrades() *upgrade.Service {
	return upgrade.New(upgrade.Config{Store: s.store, Content: s.cfg.Content, Now: s.now, Logger: s.log, ReleaseKey: s.cfg.ReleaseKey,
		UploadDir: s.cfg.UploadDir, ReadTTL: cmp.Or(s.cfg.ContentReadTTL, artifact.DefaultContentReadTTL), Every: s.cfg.ReconcileEvery,
		NodeReady: func(n store.Node) bool { return s.nodeStatus(n) == api.NodeReady }, Issue: s.issueFenced,
		NodeChanged: s.nodeChanged, Leader: s.leader})
}
