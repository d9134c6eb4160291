package nodeagent

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// inventoryRuntime is a memRuntime whose facts list GPUs, which keeps what
// it is given back at the agent's start (GPUInventoryKeeper) and lists it
// as the hostfacts sampler does: the kept GPUs first, then any new ones.
type inventoryRuntime struct {
	*memRuntime
	mu       sync.Mutex
	listed   []nodeproto.Accelerator
	restored []nodeproto.Accelerator
}

func (r *inventoryRuntime) Facts(ctx context.Context) (nodeproto.NodeFacts, error) {
	f, err := r.memRuntime.Facts(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	f.Accelerators = slices.Clone(r.restored)
	for _, g := range r.listed {
		if !slices.Contains(f.Accelerators, g) {
			f.Accelerators = append(f.Accelerators, g)
		}
	}
	return f, err
}

func (r *inventoryRuntime) RestoreGPUs(known []nodeproto.Accelerator) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restored = slices.Clone(known)
}

func (r *inventoryRuntime) restoredGPUs() []nodeproto.Accelerator {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.restored)
}

func gpusNamed(uuids ...string) []nodeproto.Accelerator {
	var out []nodeproto.Accelerator
	for _, u := range uuids {
		out = append(out, nodeproto.Accelerator{Vendor: "nvidia", Model: "H100", UUID: u})
	}
	return out
}

// TestGPUInventoryKeptAcrossRestarts: the GPUs the facts list are kept in
// the state file; an agent started again on it hands them back to its
// runtime (so a card gone while it was down is still known), and
// WithForgetGPUs, like an enrollment, starts afresh.
func TestGPUInventoryKeptAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	tr := &chanTransport{commands: make(chan nodeproto.Command)}
	four := gpusNamed("GPU-a", "GPU-b", "GPU-c", "GPU-d")
	rt := &inventoryRuntime{memRuntime: newMemRuntime(), listed: four}
	stop := startTestAgent(t, rt, tr, dir)
	kept := func() []nodeproto.Accelerator {
		state, err := OpenState(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer state.Close()
		gpus, err := state.GPUInventory()
		if err != nil {
			t.Fatal(err)
		}
		return gpus
	}
	reported := func(n int) func() bool {
		return func() bool {
			tr.mu.Lock()
			defer tr.mu.Unlock()
			for _, e := range tr.events {
				if e.Kind == nodeproto.EventFacts && len(e.Facts.Accelerators) == n {
					return true
				}
			}
			return false
		}
	}
	waitUntil(t, "the facts' four GPUs reported", reported(4))
	stop()
	if got := kept(); !slices.Equal(got, four) {
		t.Fatalf("kept %v, want the four GPUs", got)
	}

	// GPU-c is gone when the agent starts again: it is handed back, so
	// the runtime still lists it (and its sampler finds it missing).
	three := gpusNamed("GPU-a", "GPU-b", "GPU-d")
	again := &inventoryRuntime{memRuntime: newMemRuntime(), listed: three}
	stop = startTestAgent(t, again, tr, dir)
	waitUntil(t, "the kept GPUs restored", func() bool { return len(again.restoredGPUs()) == 4 })
	stop()
	if got := kept(); !slices.Equal(got, four) {
		t.Fatalf("after a restart kept %v, want the four still", got)
	}

	// An operator who took GPU-c out starts the agent with --forget-gpus.
	tr.mu.Lock()
	tr.events = nil
	tr.mu.Unlock()
	fresh := &inventoryRuntime{memRuntime: newMemRuntime(), listed: three}
	stop = startTestAgent(t, fresh, tr, dir, WithForgetGPUs())
	waitUntil(t, "the three listed GPUs reported", reported(3))
	stop()
	if got := kept(); !slices.Equal(got, three) || len(fresh.restoredGPUs()) != 0 {
		t.Fatalf("after --forget-gpus kept %v (restored %v), want the three listed", got, fresh.restoredGPUs())
	}
}

// TestEnrollmentForgetsTheGPUInventory: a fresh enrollment starts the
// inventory afresh (how a node's cards are forgotten without a flag).
func TestEnrollmentForgetsTheGPUInventory(t *testing.T) {
	state, err := OpenState(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	if err := state.SaveGPUInventory(gpusNamed("GPU-a")); err != nil {
		t.Fatal(err)
	}
	if gpus, err := state.GPUInventory(); err != nil || len(gpus) != 1 {
		t.Fatalf("kept %v, %v", gpus, err)
	}
	if err := state.Enrolled("n1", nodeproto.Enrollment{SessionToken: "s", FencingToken: 2}); err != nil {
		t.Fatal(err)
	}
	if gpus, err := state.GPUInventory(); err != nil || gpus != nil {
		t.Fatalf("after enrollment kept %v, %v; want none", gpus, err)
	}
}

// diagRuntime is a memRuntime with a GPU diagnostic that has nothing to
// diagnose for its first notReady calls; its facts count the finished runs.
type diagRuntime struct {
	*memRuntime
	mu       sync.Mutex
	notReady int
	calls    int
	runs     int
}

func (r *diagRuntime) DiagnoseGPUs(context.Context) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.calls <= r.notReady {
		return false, nil
	}
	r.runs++
	return true, nil
}

func (r *diagRuntime) Facts(ctx context.Context) (nodeproto.NodeFacts, error) {
	f, err := r.memRuntime.Facts(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	f.Notes = []string{fmt.Sprintf("diagnosed %d times", r.runs)}
	return f, err
}

// TestGPUDiagRetriedUntilListedThenReported: the diagnostic is tried again
// after each sample period while the GPUs are not listed yet, and a run
// that finished wakes the facts loop (the heartbeat here is an hour, so
// the facts reporting it were read because of the run).
func TestGPUDiagRetriedUntilListedThenReported(t *testing.T) {
	tr := &chanTransport{commands: make(chan nodeproto.Command)}
	rt := &diagRuntime{memRuntime: newMemRuntime(), notReady: 2}
	stop := startTestAgent(t, rt, tr, t.TempDir(), WithHeartbeat(time.Hour), WithGPUSampleEvery(time.Millisecond), WithGPUDiagEvery(0))
	defer stop()
	waitUntil(t, "facts reporting the diagnostic's run", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for _, e := range tr.events {
			if e.Kind == nodeproto.EventFacts && slices.Contains(e.Facts.Notes, "diagnosed 1 times") {
				return true
			}
		}
		return false
	})
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.calls != 3 || rt.runs != 1 {
		t.Fatalf("%d calls, %d runs; want 2 not ready, then 1 run", rt.calls, rt.runs)
	}
}
