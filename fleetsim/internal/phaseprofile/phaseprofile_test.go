package phaseprofile

import (
	"context"
	"os"
	"path/filepath"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/mercator/mercator/internal/cpuprofile"
	"github.com/mercator/mercator/internal/cputime"
)

// TestPhases: a profile in three phases ("", takeover, after) sums
// its samples over all of them, and writes each phase to a file of its
// own that reads as a profile, the files together holding those samples.
func TestPhases(t *testing.T) {
	var p Profile
	burn := func(component string) {
		pprof.Do(context.Background(), pprof.Labels("component", component), func(context.Context) {
			// 150 ms of this process's CPU, about 15 samples at pprof's
			// 100 Hz, however loaded the machine is.
			for start := cputime.Self(); cputime.Self()-start < 150*time.Millisecond; {
				for i := 0; i < 1e5; i++ {
					_ = i * i
				}
			}
		})
	}
	for _, phase := range []struct{ name, component string }{{"", "controlplane"}, {"takeover", "agents"}, {"after", "controlplane"}} {
		if !p.Begin(phase.name) {
			t.Fatalf("phase %q: the CPU profiler could not start (is another profile running?)", phase.name)
		}
		burn(phase.component)
	}
	p.End()
	split, err := p.ByLabel("component")
	if err != nil {
		t.Fatal(err)
	}
	if split["controlplane"] == 0 || split["agents"] == 0 {
		t.Errorf("split %v; want samples of both components, from every phase", split)
	}
	path := filepath.Join(t.TempDir(), "hold.prof")
	if err := p.Write(path); err != nil {
		t.Fatal(err)
	}
	var sum time.Duration
	for _, file := range []string{path, path + ".takeover", path + ".after"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		one, err := cpuprofile.ByLabel(b, "component")
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, d := range one {
			sum += d
		}
	}
	var want time.Duration
	for _, d := range split {
		want += d
	}
	if sum != want {
		t.Errorf("the files hold %v of samples, the split %v; want the same", sum, want)
	}
}
