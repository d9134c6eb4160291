package dockerruntime

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/image"

	"github.com/mercator/mercator/hostfacts"
)

// gpuFixtures is testdata/gpu at the module root (see its README, and
// package hostfacts, whose tests use every machine there).
func gpuFixtures(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "testdata", "gpu"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestFactsCarryAccelerators goes through Runtime.Facts with the
// options an operator sets. Whether this machine has the container hook is
// not the test's to decide, so it checks the answer that matches what is
// installed here: the H100s when the hook is found, else a note saying it
// is missing.
func TestFactsCarryAccelerators(t *testing.T) {
	t.Parallel()
	fixtures := gpuFixtures(t)
	fake := &fakeDocker{
		serverVersion: func() (types.Version, error) { return types.Version{Version: "20.10.24", APIVersion: "1.41"}, nil },
		imageList:     func() ([]image.Summary, error) { return nil, nil },
	}
	rt := newRuntime(fake,
		WithAcceleratorTool(filepath.Join(fixtures, "h100-80gb-hbm3-x8", "nvidia-smi")),
		WithKernelReports(filepath.Join(fixtures, "h100-80gb-hbm3-x8", "proc")))
	rt.cgroupRoot = t.TempDir()
	facts, err := rt.Facts(context.Background())
	if err != nil {
		t.Fatalf("Facts: %v", err)
	}
	accelNotes := slices.DeleteFunc(slices.Clone(facts.Notes), func(n string) bool { return !strings.HasPrefix(n, "accelerators:") })
	if hostfacts.ContainerHook() != "" {
		if len(facts.Accelerators) != 8 || len(accelNotes) != 0 || facts.Accelerators[7].CUDAVersion != "12.4" {
			t.Fatalf("facts = %+v, want the 8 H100s and no accelerator notes", facts)
		}
	} else if len(facts.Accelerators) != 0 || len(accelNotes) != 1 || !strings.Contains(accelNotes[0], hostfacts.NVIDIAContainerHook) {
		t.Fatalf("facts = %+v, want no GPUs and a note naming the missing hook", facts)
	}
}
