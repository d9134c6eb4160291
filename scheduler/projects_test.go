package scheduler

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// h100Node is a ready machine of 8 H100s, 64 CPUs and 512 GiB.
func h100Node(id string) Node {
	n := Node{ID: id, Ready: true, CPU: 64, MemoryBytes: 512 * gib, UsedGPUs: map[string]bool{}}
	for k := range 8 {
		n.GPUs = append(n.GPUs, GPU{UUID: fmt.Sprintf("GPU-%s-%d", id, k), Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 * gib})
	}
	return n
}

// gpuRun is a run of one project asking for n H100s, 8 CPUs and 64 GiB a GPU.
func gpuRun(id, project string, n, priority int) Run {
	return Run{ID: id, Project: project, Priority: priority, GPUs: n, GPUModel: "H100", CPU: float64(8 * n), MemoryBytes: int64(n) * 64 * gib}
}

// gpuQuota is a quota of n H100s with the CPU and memory they come with.
func gpuQuota(name string, n int, weight float64) Project {
	return Project{Name: name, GPUs: map[string]int{"H100": n}, CPU: float64(8 * n), MemoryBytes: int64(n) * 64 * gib, Weight: weight}
}

// hold records on s that run r holds GPUs on node ni, as an attempt.
func hold(s *Snapshot, ni int, r Run, order int64) {
	n := &s.Nodes[ni]
	var gpus []string
	for _, g := range n.GPUs {
		if len(gpus) < r.GPUs && !n.UsedGPUs[g.UUID] {
			n.UsedGPUs[g.UUID] = true
			gpus = append(gpus, g.UUID)
		}
	}
	n.UsedCPU += r.CPU
	n.UsedMemory += r.MemoryBytes
	s.Running = append(s.Running, Running{RunID: r.ID, NodeID: n.ID, Project: r.Project, Priority: r.Priority, Order: order,
		CPU: r.CPU, MemoryBytes: r.MemoryBytes, GPUs: gpus})
}

// TestQuotaReasonInTheIssuesWords: a project at its quota with nothing to
// borrow says so, in those words.
func TestQuotaReasonInTheIssuesWords(t *testing.T) {
	s := Snapshot{Nodes: []Node{h100Node("n1"), h100Node("n2")}, Projects: []Project{gpuQuota("vision", 16, 1)}}
	for k := range 16 {
		hold(&s, k/8, gpuRun(fmt.Sprintf("r-run-%d", k), "vision", 1, 0), int64(k))
	}
	s.Pending = []Run{gpuRun("r-next", "vision", 1, 0)}
	plan := Schedule(s)
	if want := "waiting: project vision is at its quota of 16 H100 (16 in use, 0 borrowable)"; plan.Waiting["r-next"] != want {
		t.Errorf("reason = %q\nwant     %q", plan.Waiting["r-next"], want)
	}
	if len(plan.Preemptions) != 0 {
		t.Errorf("preempted %+v of its own project at equal priority", plan.Preemptions)
	}
}

// TestBorrowThenReclaim: a project with no quota borrows the idle fleet;
// when the owner of the quota submits, the borrowed work is preempted (the
// newest first, no more than the room needed), with the reason in the
// issue's words; once those attempts are stopping, the next plan preempts
// nothing more and the owner's run waits for them.
func TestBorrowThenReclaim(t *testing.T) {
	s := Snapshot{Nodes: []Node{h100Node("n1"), h100Node("n2")}, Projects: []Project{gpuQuota("nlp", 8, 1), {Name: "bulk"}}}
	for k := range 16 {
		s.Pending = append(s.Pending, gpuRun(fmt.Sprintf("r-bulk-%02d", k), "bulk", 1, 0))
	}
	plan := Schedule(s)
	if len(plan.Placements) != 16 {
		t.Fatalf("borrowing placed %d runs on an idle fleet of 16 GPUs, want 16; waiting %v", len(plan.Placements), plan.Waiting)
	}
	s = Snapshot{Nodes: []Node{h100Node("n1"), h100Node("n2")}, Projects: s.Projects}
	for k := range 16 {
		hold(&s, k/8, gpuRun(fmt.Sprintf("r-bulk-%02d", k), "bulk", 1, 0), int64(k))
	}
	s.Pending = []Run{gpuRun("r-nlp", "nlp", 2, 100)}
	plan = Schedule(s)
	if len(plan.Preemptions) != 2 {
		t.Fatalf("preemptions = %+v, want the 2 newest bulk attempts on one node", plan.Preemptions)
	}
	for _, p := range plan.Preemptions {
		if p.NodeID != "n1" || !slices.Contains([]string{"r-bulk-06", "r-bulk-07"}, p.RunID) ||
			p.Reason != "preempted by r-nlp (priority 100) to reclaim project nlp's quota" || p.Key != "reclaim:nlp" {
			t.Errorf("preemption %+v", p)
		}
	}
	if !strings.Contains(plan.Waiting["r-nlp"], "preempting r-bulk-0") {
		t.Errorf("the preemptor's reason = %q", plan.Waiting["r-nlp"])
	}
	for i := range s.Running {
		if slices.ContainsFunc(plan.Preemptions, func(p Preemption) bool { return p.RunID == s.Running[i].RunID }) {
			s.Running[i].Stopping = true
		}
	}
	again := Schedule(s)
	if len(again.Preemptions) != 0 || !strings.Contains(again.Waiting["r-nlp"], "being freed") {
		t.Errorf("with the victims stopping: preemptions %+v, reason %q", again.Preemptions, again.Waiting["r-nlp"])
	}
}

// TestPriorityOrderAndPreemptionWithinAProject: higher priority first,
// then submission order; lower-priority work of the same project is
// preempted for a higher one, never equal work and never another
// project's work that is within its quota; and not twice for one reason.
func TestPriorityOrderAndPreemptionWithinAProject(t *testing.T) {
	s := Snapshot{Nodes: []Node{h100Node("n1")}, Projects: []Project{gpuQuota("a", 4, 1), gpuQuota("b", 4, 1)}}
	s.Pending = []Run{gpuRun("r-low", "a", 2, 0), gpuRun("r-high", "a", 2, 10), gpuRun("r-mid", "a", 2, 5), gpuRun("r-b", "b", 4, 0)}
	plan := Schedule(s)
	var placed []string
	for _, p := range plan.Placements {
		placed = append(placed, p.RunID)
	}
	if !slices.Contains(placed, "r-high") || !slices.Contains(placed, "r-mid") || !slices.Contains(placed, "r-b") || slices.Contains(placed, "r-low") {
		t.Errorf("placed %v, want r-high and r-mid of a, and r-b", placed)
	}

	s = Snapshot{Nodes: []Node{h100Node("n1")}, Projects: s.Projects}
	hold(&s, 0, gpuRun("r-a-low", "a", 4, 0), 1)
	hold(&s, 0, gpuRun("r-b-low", "b", 4, -5), 2)
	s.Pending = []Run{gpuRun("r-a-urgent", "a", 2, 50)}
	plan = Schedule(s)
	if len(plan.Preemptions) != 1 || plan.Preemptions[0].RunID != "r-a-low" || plan.Preemptions[0].Key != "priority:a" {
		t.Fatalf("preemptions = %+v, want r-a-low for priority", plan.Preemptions)
	}
	s.Running[0].PreemptedFor = []string{"priority:a"}
	if plan = Schedule(s); len(plan.Preemptions) != 0 {
		t.Errorf("preempted again for the same reason: %+v", plan.Preemptions)
	}
}

// TestOneProjectPlansAsBefore: a snapshot whose only project has no quota,
// with no priorities, is planned exactly as without projects (first come,
// first served), placements and reasons alike.
func TestOneProjectPlansAsBefore(t *testing.T) {
	for seed := int64(1); seed <= 5; seed++ {
		s := benchSnapshot(200, 2000, seed)
		plain := Schedule(s)
		s.Projects = []Project{{Name: "default"}}
		teams := Schedule(s)
		if !slices.EqualFunc(plain.Placements, teams.Placements, func(a, b Placement) bool {
			return a.RunID == b.RunID && a.NodeID == b.NodeID && slices.Equal(a.GPUs, b.GPUs)
		}) {
			t.Fatalf("seed %d: placements differ with one project", seed)
		}
		for id, why := range plain.Waiting {
			if teams.Waiting[id] != why {
				t.Fatalf("seed %d: %s waits %q with one project, %q without", seed, id, teams.Waiting[id], why)
			}
		}
	}
}

// TestConstraintsSelectNodesAndExplainMisses: a constrained run goes only
// to a node whose labels match (one of the values a key accepts), and
// waits saying how many nodes lack the label.
func TestConstraintsSelectNodesAndExplainMisses(t *testing.T) {
	secure, plain, gpu := h100Node("n-secure"), h100Node("n-plain"), h100Node("n-gpu")
	secure.Labels = map[string]string{"pool": "secure"}
	gpu.Labels = map[string]string{"pool": "gpu", "zone": "b"}
	s := Snapshot{Nodes: []Node{plain, secure, gpu}}
	s.Pending = []Run{
		{ID: "r-secure", CPU: 1, Constraints: map[string][]string{"pool": {"secure"}}},
		{ID: "r-either", CPU: 1, GPUs: 8, Constraints: map[string][]string{"pool": {"gpu", "secure"}}},
		{ID: "r-zone", CPU: 1, Constraints: map[string][]string{"pool": {"secure"}, "zone": {"b"}}},
	}
	plan := Schedule(s)
	where := map[string]string{}
	for _, p := range plan.Placements {
		where[p.RunID] = p.NodeID
	}
	if where["r-secure"] != "n-secure" || (where["r-either"] != "n-secure" && where["r-either"] != "n-gpu") {
		t.Errorf("placements %v", where)
	}
	if want := "waiting: 3 nodes have no label pool=secure,zone=b"; plan.Waiting["r-zone"] != want {
		t.Errorf("reason %q, want %q", plan.Waiting["r-zone"], want)
	}
}

// TestFunctionsCountAgainstTheQuota: what a project's function containers
// hold counts as its use, so a run that would fit its quota alone borrows,
// and with nothing to borrow waits on the quota.
func TestFunctionsCountAgainstTheQuota(t *testing.T) {
	n := h100Node("n1")
	n.UsedCPU = 64 // the fleet is full
	s := Snapshot{Nodes: []Node{n}, Projects: []Project{{Name: "nlp", CPU: 8, MemoryBytes: 64 * gib, FunctionCPU: 6}}}
	s.Pending = []Run{{ID: "r-1", Project: "nlp", CPU: 4}}
	plan := Schedule(s)
	if want := "waiting: project nlp is at its quota of 8 CPUs (6 in use, 0 borrowable)"; plan.Waiting["r-1"] != want {
		t.Errorf("reason %q, want %q", plan.Waiting["r-1"], want)
	}
	if plan.Shares["nlp"] == 0 {
		t.Error("the functions' use is not in the project's share")
	}
}
