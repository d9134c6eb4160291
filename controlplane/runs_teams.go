package controlplane

import (
	"context"
	"errors"

	"github.com/mercator/mercator/controlplane/internal/nodereport"
	"github.com/mercator/mercator/controlplane/internal/placement"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// Teams in the reconcile loop (docs/teams.md): the scheduler plans by
// project when there is anything to plan by (a stored project, or a queued
// run with a priority), and the loop carries out the preemptions its plan
// decides. Without either, the plan is the plain first-come-first-served
// one and a pass costs what it did before projects existed.

// withTeams adds the projects and the running work to a snapshot when there
// is anything to plan by (placement.NeedsTeams).
func (s *Server) withTeams(ctx context.Context, snap *scheduler.Snapshot, queued []store.Run, pending map[string]store.Run) error {
	projects, err := project.Load(ctx, s.store)
	if err != nil {
		return err
	}
	if !placement.NeedsTeams(projects, queued) {
		return nil
	}
	use, err := project.FunctionUses(ctx, s.store, s.schedView.from)
	if err != nil {
		return err
	}
	placement.WithProjects(snap, projects, pending, s.teams.Of, use)
	placement.WithRunning(snap, s.sched.EachActive, s.now(), s.cfg.PreemptWindow)
	return nil
}

// schedule plans a pass: by project when there is anything to plan by,
// carrying out the plan's preemptions before its placements are committed.
func (s *Server) schedule(ctx context.Context, snap scheduler.Snapshot, queued []store.Run, pending map[string]store.Run) (scheduler.Plan, error) {
	if err := s.withTeams(ctx, &snap, queued, pending); err != nil {
		return scheduler.Plan{}, err
	}
	plan := scheduler.Schedule(snap)
	return plan, s.commitPreemptions(ctx, plan)
}

// commitPreemptions carries out a plan's preemptions, in one transaction:
// each victim's attempt is marked (lifecycle.Preempt) and its node sent a
// stop with the run's grace period. A victim that changed since the
// snapshot (it ended, or is already stopping) is left alone: the next plan
// sees it as it is. It also folds the plan's shares into the history.
func (s *Server) commitPreemptions(ctx context.Context, plan scheduler.Plan) error {
	if plan.Shares != nil {
		s.teams.Decay(plan.Shares, s.now(), s.cfg.ShareHalfLife)
	}
	if len(plan.Preemptions) == 0 {
		return nil
	}
	err := s.update(ctx, func(tx store.Tx) error {
		now := s.now()
		for _, p := range plan.Preemptions {
			run, err := tx.GetRun(p.RunID)
			if errors.Is(err, failure.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			cur := lifecycle.Current(&run.Run)
			if cur == nil || cur.NodeID != p.NodeID {
				continue
			}
			a := lifecycle.Preempt(&run.Run, cur.Number, p.Reason, p.Key, now)
			if a == nil {
				continue
			}
			if err := s.issue(tx, a.NodeID, nodeproto.Command{Kind: nodeproto.KindStopWorkload, StopWorkload: &nodeproto.StopWorkloadCommand{
				WorkloadKey: nodeproto.WorkloadKey{RunID: run.ID, Attempt: a.Number}, Reason: "preempted", GracePeriod: nodereport.GraceOf(run)}}); err != nil {
				return err
			}
			if err := tx.PutRun(run); err != nil {
				return err
			}
			s.log.Info("run preempted", "run", run.ID, "attempt", a.Number, "node", a.NodeID, "by", p.By, "why", p.Reason)
		}
		return nil
	})
	if err == nil {
		s.runsChanged()
	}
	return err
}
