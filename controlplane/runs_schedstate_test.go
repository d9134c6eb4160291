package controlplane

import (
	"context"
	"fmt"
	"math"
	"sort"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/placement"
	"github.com/mercator/mercator/controlplane/internal/schedcopy"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// TestSchedStateMatchesStore holds the reconcile loop's copies (schedcopy.Copy:
// the nodes' records, what active attempts hold, kept up to date by the
// writes this replica commits) to the snapshot read from the store alone,
// through placements, GPU holdings, attempts ending, a replacement and a
// cancellation. A difference would be a placement decided on capacity that
// is not there.
func TestSchedStateMatchesStore(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	st := memstore.New()
	srv := New(Config{Now: func() time.Time { return now }}, st, nil, nil)
	for i := range 4 {
		id := fmt.Sprintf("n%d", i)
		facts := &nodeproto.NodeFacts{CPUs: 16, MemoryBytes: 64 << 30,
			Accelerators: []nodeproto.Accelerator{{UUID: id + "-g0", Model: "H100", MemoryBytes: 80 << 30}, {UUID: id + "-g1", Model: "H100", MemoryBytes: 80 << 30}}}
		if err := srv.update(ctx, func(tx store.Tx) error {
			return tx.PutNode(store.Node{ID: id, CreatedAt: now, EnrolledAt: &now, LastSeenAt: &now, Facts: facts})
		}); err != nil {
			t.Fatal(err)
		}
	}
	submit := func(id string, cpu float64, gpus int) {
		t.Helper()
		r := store.Run{Run: api.Run{ID: id, RunSpec: api.RunSpec{Image: "r/i@sha256:" + fmt.Sprintf("%064d", 0), CPU: cpu, MemoryBytes: 1 << 30, GPUs: gpus},
			Status: api.RunQueued, Attempts: []api.Attempt{}, CreatedAt: now, UpdatedAt: now}}
		if err := srv.update(ctx, func(tx store.Tx) error { return tx.CreateRun(r) }); err != nil {
			t.Fatal(err)
		}
	}
	change := func(id string, fn func(r *api.Run)) {
		t.Helper()
		now = now.Add(time.Second)
		if err := srv.update(ctx, func(tx store.Tx) error {
			r, err := tx.GetRun(id)
			if err != nil {
				return err
			}
			fn(&r.Run)
			return tx.PutRun(r)
		}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		t.Helper()
		var want scheduler.Snapshot
		if err := st.View(ctx, func(tx store.Tx) error {
			var err error
			want, _, err = srv.snapshot(tx)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		nodes, err := srv.nodeList(ctx, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.refreshUsage(ctx); err != nil {
			t.Fatal(err)
		}
		view, index := srv.nodeViewOf(nodes)
		got, _ := placement.Snapshot(view, index, srv.sched.EachNodeSum, nil)
		if len(got.Nodes) != len(want.Nodes) {
			t.Fatalf("%s: %d nodes, want %d", when, len(got.Nodes), len(want.Nodes))
		}
		for i, w := range want.Nodes {
			g := got.Nodes[i]
			if g.ID != w.ID || math.Abs(g.UsedCPU-w.UsedCPU) > 1e-9 || g.UsedMemory != w.UsedMemory || g.Ready != w.Ready ||
				fmt.Sprint(keys(g.UsedGPUs)) != fmt.Sprint(keys(w.UsedGPUs)) {
				t.Errorf("%s: node %s from the copies: cpu %.2f mem %d gpus %v ready %v; from the store: cpu %.2f mem %d gpus %v ready %v",
					when, w.ID, g.UsedCPU, g.UsedMemory, keys(g.UsedGPUs), g.Ready, w.UsedCPU, w.UsedMemory, keys(w.UsedGPUs), w.Ready)
			}
		}
	}

	check("empty")
	submit("a", 2, 0)
	submit("b", 1.5, 1)
	submit("c", 4, 2)
	check("queued")
	change("a", func(r *api.Run) { lifecycle.Place(r, "n0", nil, now) })
	change("b", func(r *api.Run) { lifecycle.Place(r, "n1", []string{"n1-g0"}, now) })
	change("c", func(r *api.Run) { lifecycle.Place(r, "n1", []string{"n1-g1", "n0-g0"}, now) })
	check("placed")
	change("a", func(r *api.Run) {
		lifecycle.Observe(r, "n0", nodeproto.WorkloadObservation{WorkloadKey: nodeproto.WorkloadKey{RunID: "a", Attempt: 1}, Phase: nodeproto.PhaseRunning, StartedAt: &now}, now)
	})
	check("running")
	exit := 0
	change("b", func(r *api.Run) {
		lifecycle.Observe(r, "n1", nodeproto.WorkloadObservation{WorkloadKey: nodeproto.WorkloadKey{RunID: "b", Attempt: 1}, Phase: nodeproto.PhaseExited, ExitCode: &exit, StartedAt: &now, FinishedAt: &now}, now)
	})
	check("b exited")
	change("c", func(r *api.Run) { lifecycle.Replace(r, now.Add(-time.Minute), now) })
	check("c replaced")
	change("c", func(r *api.Run) { lifecycle.Place(r, "n2", []string{"n2-g0", "n2-g1"}, now) })
	check("c placed again")
	change("a", func(r *api.Run) { lifecycle.Cancel(r, now) })
	check("a cancelled")

	// A rebuild from the store gives the same copies.
	srv.sched.Invalidate()
	check("rebuilt")
}

// snapshot builds the scheduler's view from the store alone, as every pass
// did before the reconcile loop kept copies (schedcopy); tests compare
// against it.
func (s *Server) snapshot(tx store.Tx) (scheduler.Snapshot, map[string]store.Run, error) {
	nodes, err := tx.ListNodes()
	if err != nil {
		return scheduler.Snapshot{}, nil, err
	}
	active, err := tx.ListRuns(store.ListRunsOptions{Statuses: []string{api.RunPlaced, api.RunPreparing, api.RunRunning}})
	if err != nil {
		return scheduler.Snapshot{}, nil, err
	}
	queued, err := tx.ListRuns(store.ListRunsOptions{Statuses: []string{api.RunQueued}})
	if err != nil {
		return scheduler.Snapshot{}, nil, err
	}
	view, index := s.nodeViewOf(nodes)
	snap, pending := placement.Snapshot(view, index, func(fn func(schedcopy.Usage)) {
		for _, r := range active {
			if u, ok := schedcopy.UsageOf(r); ok {
				fn(u)
			}
		}
	}, queued)
	return snap, pending, nil
}

// nodeViewOf is the scheduler's view of nodes, each with the status
// nodeStatus gives it, indexed by ID.
func (s *Server) nodeViewOf(nodes []store.Node) ([]scheduler.Node, map[string]int) {
	view := make([]scheduler.Node, 0, len(nodes))
	index := make(map[string]int, len(nodes))
	for _, n := range nodes {
		index[n.ID] = len(view)
		view = append(view, placement.Node(n, s.nodeStatus(n), s.now()))
	}
	return view, index
}

func keys(m map[string]bool) []string {
	var out []string
	for k, v := range m {
		if v {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}
