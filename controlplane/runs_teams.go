package controlplane

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/mercator/mercator/api"
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

// runTeams is what the scheduler reads of an active run when it plans by
// project.
type runTeams struct {
	project  string
	priority int
	placed   time.Time // of the current attempt: newer victims go first
	stopping bool      // the current attempt has a stop on its way
	gpus     []string  // the current attempt's
	deadline time.Time // when its timeout ends it, if it has one and started
	// preempted is each reason its attempts were preempted for, with when.
	preempted map[string]time.Time
}

// teamsOf is a run as runTeams.
func teamsOf(r store.Run) runTeams {
	t := runTeams{project: api.ProjectOf(r.Project), priority: r.Priority}
	if a := lifecycle.Current(&r.Run); a != nil {
		t.placed, t.stopping, t.gpus = a.PlacedAt, a.StopRequested, a.GPUs
		if r.TimeoutSeconds > 0 && a.StartedAt != nil {
			t.deadline = a.StartedAt.Add(time.Duration(r.TimeoutSeconds) * time.Second)
		}
	}
	for _, a := range r.Attempts {
		if a.PreemptedFor != "" && a.PreemptedAt != nil {
			if t.preempted == nil {
				t.preempted = map[string]time.Time{}
			}
			if at, ok := t.preempted[a.PreemptedFor]; !ok || a.PreemptedAt.After(at) {
				t.preempted[a.PreemptedFor] = *a.PreemptedAt
			}
		}
	}
	return t
}

// withTeams adds the projects and the running work to a snapshot when there
// is anything to plan by.
func (s *Server) withTeams(ctx context.Context, snap *scheduler.Snapshot, queued []store.Run, pending map[string]store.Run) error {
	projects, err := project.Load(ctx, s.store)
	if err != nil {
		return err
	}
	needed := len(projects) > 1
	for _, r := range queued {
		needed = needed || r.Priority != 0 || api.ProjectOf(r.Project) != api.DefaultProject
	}
	for _, p := range projects {
		needed = needed || p.Weight != 0 || p.MaxRunning != 0 || p.Quota.CPU != 0 || p.Quota.MemoryBytes != 0 || len(p.Quota.GPUs) > 0 || len(p.Pools) > 0
	}
	if !needed {
		return nil
	}
	pools := map[string][]string{}
	for name, p := range projects {
		pools[name] = p.Pools
	}
	withPools(snap, pools, pending) // nodes_labels.go
	names := make([]string, 0, len(projects))
	for name := range projects {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := projects[name]
		snap.Projects = append(snap.Projects, scheduler.Project{Name: name, GPUs: p.Quota.GPUs, CPU: p.Quota.CPU, MemoryBytes: p.Quota.MemoryBytes,
			MaxRunning: p.MaxRunning, Weight: p.Weight, History: s.teams.Of(name)})
	}
	use, err := project.FunctionUses(ctx, s.store, s.sched.viewFrom)
	if err != nil {
		return err
	}
	for i := range snap.Projects {
		u := use[snap.Projects[i].Name]
		snap.Projects[i].FunctionCPU, snap.Projects[i].FunctionMemoryBytes = u.CPU, u.MemoryBytes
	}
	now := s.now()
	s.sched.eachActive(func(id string, u runUsage) {
		if u.current == "" {
			return
		}
		r := scheduler.Running{RunID: id, NodeID: u.current, Project: u.teams.project, Priority: u.teams.priority,
			Order: u.teams.placed.UnixNano(), CPU: u.cpu, MemoryBytes: u.mem, GPUs: u.teams.gpus, Stopping: u.teams.stopping}
		for key, at := range u.teams.preempted {
			if now.Sub(at) < s.cfg.PreemptWindow {
				r.PreemptedFor = append(r.PreemptedFor, key)
			}
		}
		snap.Running = append(snap.Running, r)
	})
	sort.Slice(snap.Running, func(i, j int) bool { return snap.Running[i].RunID < snap.Running[j].RunID })
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

// graceOf is the time a run's container gets between SIGTERM and SIGKILL.
func graceOf(r store.Run) time.Duration {
	if r.GraceSeconds > 0 {
		return time.Duration(r.GraceSeconds) * time.Second
	}
	return 10 * time.Second
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
				WorkloadKey: nodeproto.WorkloadKey{RunID: run.ID, Attempt: a.Number}, Reason: "preempted", GracePeriod: graceOf(run)}}); err != nil {
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
