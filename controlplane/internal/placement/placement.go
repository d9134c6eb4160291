// Package placement translates between the control plane's records and
// the pure scheduler: the scheduler's view of a node (Node) and of the
// queue (Snapshot), and the commands a placement sends its node (Launch,
// PrepareArtifacts), checked against what the node's agent speaks
// (TooOld). It decides nothing itself and holds no state; what it reads
// of the store it reads through the transaction it is given. Only package
// controlplane may import it.
package placement

import (
	"maps"
	"sort"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/factcheck"
	"github.com/mercator/mercator/controlplane/internal/schedcopy"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// LostSince is when a node's work became lost, or nil while it is not: a
// node removed by `mercator node rm` since its removal, an unreachable one
// (status) since its lease ran out after it was last seen.
func LostSince(n store.Node, status string, seen *time.Time, lease time.Duration) *time.Time {
	switch {
	case n.RemovedAt != nil:
		return n.RemovedAt
	case n.EnrolledAt != nil && status == api.NodeUnreachable && seen != nil:
		t := seen.Add(lease)
		return &t
	}
	return nil
}

// Labels is a node's labels: its agent's (`agent --label`), with its
// operator's (`node label`) over them.
func Labels(n store.Node) map[string]string {
	if n.Facts == nil || len(n.Facts.Labels) == 0 {
		return n.Labels
	}
	out := maps.Clone(n.Facts.Labels)
	maps.Copy(out, n.Labels)
	return out
}

// Node is a node as the scheduler sees it, with the status given, at now
// (which decides whether its measured link is still valid), without what
// its active attempts hold (Snapshot adds that).
func Node(n store.Node, status string, now time.Time) scheduler.Node {
	sn := scheduler.Node{ID: n.ID, Images: map[string]bool{}, Labels: Labels(n)} // UsedGPUs: set by whoever counts attempts
	switch status {
	case api.NodeReady:
		sn.Ready = true
		if n.Draining {
			sn.Ready, sn.NotReadyReason = false, "is draining"
		}
		sn.Cordoned = n.Cordoned
		if factcheck.Has(n, api.NodeFlagFactsRefused) {
			sn.Ready, sn.NotReadyReason = false, "has facts the control plane refused (`mercator node get` says why)"
		}
	case api.NodeInvited:
		sn.NotReadyReason = "has not enrolled yet"
	default:
		sn.NotReadyReason = "is unreachable"
	}
	if f := n.Facts; f != nil {
		sn.CPU, sn.MemoryBytes, sn.AgentVersion = f.CPUs, f.MemoryBytes, f.CapabilityVersion
		for _, img := range f.Images {
			sn.Images[img] = true
		}
		disputed, withheld := factcheck.Disputed(n), factcheck.Withheld(n)
		for _, g := range f.Accelerators {
			sn.GPUs = append(sn.GPUs, scheduler.GPU{UUID: g.UUID, Model: g.Model, MemoryBytes: g.MemoryBytes, Disputed: disputed[g.UUID], Quarantined: withheld[g.UUID] != ""})
		}
		reserveFunctionShare(&sn, f)
	}
	artifactFacts(&sn, n.Facts, now)
	return sn
}

// reserveFunctionShare counts the node's function share as used when the
// scheduler places Runs: the memory, CPU and GPUs an agent set aside for
// function containers are never promised to a Run as well.
func reserveFunctionShare(sn *scheduler.Node, f *nodeproto.NodeFacts) {
	if f.Functions == nil {
		return
	}
	sn.UsedMemory += f.Functions.MemoryBytes
	sn.UsedCPU += float64(f.Functions.MilliCPUs) / 1000
	if len(f.Functions.GPUs) > 0 && sn.UsedGPUs == nil {
		sn.UsedGPUs = map[string]bool{} // Node leaves it nil
	}
	for _, id := range f.Functions.GPUs {
		sn.UsedGPUs[id] = true
	}
}

// artifactFacts is the scheduler's view of a node's Artifacts: the digests
// it holds, and its link floor (a reading still valid at now, else the
// fleet's assumption).
func artifactFacts(sn *scheduler.Node, f *nodeproto.NodeFacts, now time.Time) {
	sn.LinkFloorBPS = scheduler.AssumedLinkBytesPerSecond
	if f == nil {
		return
	}
	if l := f.Link; l != nil && l.BytesPerSecond > 0 && now.Before(l.ValidUntil) {
		sn.LinkFloorBPS = l.BytesPerSecond
	}
	if len(f.Artifacts) > 0 {
		sn.Artifacts = make(map[string]bool, len(f.Artifacts))
		for _, a := range f.Artifacts {
			sn.Artifacts[a.SHA256] = true
		}
	}
}

// Snapshot completes the scheduler's view: a copy of view (the nodes,
// indexed by ID in index) with what active attempts hold added (each
// calls its argument once per active run, or per node with the sums:
// schedcopy.Copy.EachNodeSum), and the queued runs not being cancelled,
// returned by ID as well. view is not modified.
func Snapshot(view []scheduler.Node, index map[string]int, each func(func(schedcopy.Usage)), queued []store.Run) (scheduler.Snapshot, map[string]store.Run) {
	var snap scheduler.Snapshot
	snap.Nodes = append([]scheduler.Node(nil), view...)
	// Every attempt that may still hold resources counts, replaced ones
	// included: a replaced attempt can be alive on its node.
	// A node's UsedGPUs is copied before its first change here: the view's
	// may hold its function share (reserveFunctionShare) and must not
	// collect every pass's attempts.
	copied := map[int]bool{}
	each(func(u schedcopy.Usage) {
		for _, a := range u.Attempts {
			i, ok := index[a.Node]
			if !ok {
				continue
			}
			n := &snap.Nodes[i]
			n.UsedCPU += u.CPU
			n.UsedMemory += u.Mem
			if len(a.GPUs) > 0 && !copied[i] {
				n.UsedGPUs, copied[i] = maps.Clone(n.UsedGPUs), true
			}
			for _, g := range a.GPUs {
				if n.UsedGPUs == nil {
					n.UsedGPUs = map[string]bool{}
				}
				n.UsedGPUs[g] = true
			}
		}
	})
	pending := map[string]store.Run{}
	for i := len(queued) - 1; i >= 0; i-- { // oldest first
		r := queued[i]
		if r.Cancel {
			continue
		}
		pending[r.ID] = r
		sr := scheduler.Run{ID: r.ID, Image: r.PinnedImage, CPU: r.CPU, MemoryBytes: r.MemoryBytes,
			GPUs: r.GPUs, GPUModel: r.GPUModel, GPUMemory: r.GPUMemoryBytes, MinAgentVersion: AgentVersion(r),
			Project: api.ProjectOf(r.Project), Priority: r.Priority, Constraints: project.Constraints(r.RunSpec, nil), Nodes: r.Nodes}
		for _, m := range r.Artifacts {
			sr.Artifacts = append(sr.Artifacts, m.SHA256)
			sr.MinReadBPS = max(sr.MinReadBPS, m.MinReadBytesPerSecond)
		}
		snap.Pending = append(snap.Pending, sr)
	}
	return snap, pending
}

// WithPools restricts the pending runs of projects limited to pools
// (project name → pools) to nodes of those pools; specs are the pending
// runs by ID.
func WithPools(snap *scheduler.Snapshot, pools map[string][]string, specs map[string]store.Run) {
	for i := range snap.Pending {
		sr := &snap.Pending[i]
		if p := pools[sr.Project]; len(p) > 0 {
			sr.Constraints = project.Constraints(specs[sr.ID].RunSpec, p)
		}
	}
}

// NeedsTeams reports whether the scheduler must plan by project
// (docs/teams.md): when there is a project besides the default, a queued
// run with a priority or of another project, or a project with a weight,
// a cap, a quota or pools. Otherwise the plan is the plain
// first-come-first-served one, and a pass costs what it did before
// projects existed.
func NeedsTeams(projects map[string]store.Project, queued []store.Run) bool {
	needed := len(projects) > 1
	for _, r := range queued {
		needed = needed || r.Priority != 0 || api.ProjectOf(r.Project) != api.DefaultProject
	}
	for _, p := range projects {
		needed = needed || p.Weight != 0 || p.MaxRunning != 0 || p.Quota.CPU != 0 || p.Quota.MemoryBytes != 0 || len(p.Quota.GPUs) > 0 || len(p.Pools) > 0
	}
	return needed
}

// WithProjects adds the projects to a snapshot, in name order, with their
// decayed share (history) and what their functions hold (use), and
// restricts the pending runs (by ID) of projects limited to pools.
func WithProjects(snap *scheduler.Snapshot, projects map[string]store.Project, pending map[string]store.Run, history func(project string) float64, use map[string]project.FunctionUse) {
	pools := map[string][]string{}
	for name, p := range projects {
		pools[name] = p.Pools
	}
	WithPools(snap, pools, pending)
	names := make([]string, 0, len(projects))
	for name := range projects {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p, u := projects[name], use[name]
		snap.Projects = append(snap.Projects, scheduler.Project{Name: name, GPUs: p.Quota.GPUs, CPU: p.Quota.CPU, MemoryBytes: p.Quota.MemoryBytes,
			MaxRunning: p.MaxRunning, Weight: p.Weight, History: history(name), FunctionCPU: u.CPU, FunctionMemoryBytes: u.MemoryBytes})
	}
}

// WithRunning adds the running work to a snapshot, in run ID order: each
// active run whose current attempt is active (each is
// schedcopy.Copy.EachActive), with the reasons it was preempted for within
// window before now, which the scheduler does not preempt it for again.
func WithRunning(snap *scheduler.Snapshot, each func(func(id string, u schedcopy.Usage)), now time.Time, window time.Duration) {
	each(func(id string, u schedcopy.Usage) {
		if u.Current == "" {
			return
		}
		r := scheduler.Running{RunID: id, NodeID: u.Current, Project: u.Teams.Project, Priority: u.Teams.Priority,
			Order: u.Teams.Placed.UnixNano(), CPU: u.CPU, MemoryBytes: u.Mem, GPUs: u.Teams.GPUs, Stopping: u.Teams.Stopping}
		for key, at := range u.Teams.Preempted {
			if now.Sub(at) < window {
				r.PreemptedFor = append(r.PreemptedFor, key)
			}
		}
		snap.Running = append(snap.Running, r)
	})
	sort.Slice(snap.Running, func(i, j int) bool { return snap.Running[i].RunID < snap.Running[j].RunID })
}
