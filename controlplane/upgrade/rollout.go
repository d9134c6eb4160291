package upgrade

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/mercator/mercator/controlplane/internal/rollout"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Run advances running rollouts (package rollout decides; this
// does the I/O) every Every, on the leader only, until ctx ends, so two replicas
// never send one node two upgrades.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Every)
	defer t.Stop()
	for {
		if s.cfg.Leader() {
			if err := s.Advance(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("advance rollouts", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Advance takes one step of every running rollout in one
// transaction: settles its nodes from their facts and the upgrade
// commands' results, and issues the command to the nodes that go next.
func (s *Service) Advance(ctx context.Context) error {
	var sent []string
	err := s.cfg.Store.Update(ctx, func(tx store.Tx) error {
		sent = nil
		ros, err := tx.ListRollouts()
		if err != nil {
			return err
		}
		for _, ro := range ros {
			if ro.State != store.RolloutRunning {
				continue
			}
			ids, err := s.advanceRollout(tx, ro)
			if err != nil {
				return err
			}
			sent = append(sent, ids...)
		}
		return nil
	})
	for _, id := range sent {
		s.cfg.NodeChanged(id)
	}
	return err
}

func (s *Service) advanceRollout(tx store.Tx, ro store.Rollout) ([]string, error) {
	views := make(map[string]rollout.Node, len(ro.Nodes))
	fences := make(map[string]uint64, len(ro.Nodes))
	for _, rn := range ro.Nodes {
		n, err := tx.GetNode(rn.ID)
		if errors.Is(err, failure.ErrNotFound) {
			views[rn.ID] = rollout.Node{Gone: true}
			continue
		}
		if err != nil {
			return nil, err
		}
		v := rollout.Node{Ready: s.cfg.NodeReady(n), Gone: n.RemovedAt != nil, Capability: n.Capability, Version: n.AgentVersion}
		if n.Facts != nil {
			v.Version, v.Capability = n.Facts.AgentVersion, n.Facts.CapabilityVersion
		}
		if rn.OperationID != "" {
			op, err := tx.GetOperation(rn.OperationID)
			if err != nil && !errors.Is(err, failure.ErrNotFound) {
				return nil, err
			}
			v.Result = op.Result
		}
		views[rn.ID], fences[rn.ID] = v, n.FencingToken
	}
	next, send := rollout.Step(ro, views, s.now())
	if len(send) > 0 {
		rel, err := tx.GetAgentRelease(ro.Version, ro.Platform)
		if err != nil {
			return nil, err
		}
		cmd := nodeproto.UpgradeAgentCommand{Version: rel.Version, Platform: rel.Platform, SHA256: rel.SHA256, Size: rel.Size,
			Signature: rel.Signature, PublicKey: s.cfg.ReleaseKey, Deadline: ro.Deadline}
		for i := range next.Nodes {
			rn := &next.Nodes[i]
			if rn.State != store.RolloutNodeSent || rn.OperationID != "" {
				continue
			}
			c := cmd
			issued, err := s.cfg.Issue(tx, rn.ID, fences[rn.ID], nodeproto.Command{Kind: nodeproto.KindUpgradeAgent, UpgradeAgent: &c})
			if err != nil {
				return nil, err
			}
			rn.OperationID = issued.OperationID
		}
	}
	if next.State != ro.State {
		s.log.Info("rollout "+next.State, "rollout", ro.ID, "version", ro.Version, "reason", next.Reason)
	}
	if reflect.DeepEqual(next, ro) {
		return nil, nil
	}
	return send, tx.PutRollout(next)
}
