package fnagent

import (
	"slices"
	"testing"
	"time"
)

const mib = 1 << 20

func TestResourceTrackerReservesAndReleases(t *testing.T) {
	tr := NewResourceTracker(Capacity{MemoryBytes: 256 * mib, MilliCPUs: 2000, GPUs: []string{"GPU-a", "GPU-b"}})
	fn := Resources{MemoryBytes: 128 * mib, MilliCPUs: 500, GPUs: 1}
	if !tr.Possible(fn) || tr.Possible(Resources{MemoryBytes: 512 * mib}) {
		t.Fatal("Possible is wrong")
	}
	r1, ok := tr.TryReserve(fn)
	if !ok {
		t.Fatal("first reservation refused")
	}
	r2, ok := tr.TryReserve(fn)
	if !ok {
		t.Fatal("second reservation refused")
	}
	if g1, g2 := r1.GPUs(), r2.GPUs(); len(g1) != 1 || len(g2) != 1 || g1[0] == g2[0] {
		t.Fatalf("GPUs %v and %v: want one distinct card each", g1, g2)
	}
	if _, ok := tr.TryReserve(Resources{MemoryBytes: mib}); ok {
		t.Fatal("reserved past capacity")
	}
	if short := tr.Shortfall(fn); short != (Resources{MemoryBytes: 128 * mib, GPUs: 1}) {
		t.Fatalf("Shortfall = %+v", short)
	}
	changed := tr.Changed()
	r1.Release()
	r1.Release() // harmless
	select {
	case <-changed:
	default:
		t.Fatal("Changed not closed by a release")
	}
	if free := tr.Free(); free != (Resources{MemoryBytes: 128 * mib, MilliCPUs: 1500, GPUs: 1}) {
		t.Fatalf("Free = %+v after one release", free)
	}
	r3, ok := tr.TryReserve(fn)
	if !ok || !slices.Equal(r3.GPUs(), []string{"GPU-a"}) {
		t.Fatalf("after release: %v, %v; want GPU-a again", r3, ok)
	}
}

func TestPlanEviction(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	cands := []evictionCandidate{
		{resources: Resources{MemoryBytes: 64 * mib}, idleSince: at(3)},
		{resources: Resources{MemoryBytes: 128 * mib}, idleSince: at(1)},
		{resources: Resources{MemoryBytes: 64 * mib}, idleSince: at(2)},
		{resources: Resources{GPUs: 1, MemoryBytes: 32 * mib}, idleSince: at(0)},
	}
	cases := []struct {
		name  string
		short Resources
		want  []int
	}{
		{"nothing short", Resources{}, nil},
		{"least recently used first, skipping what frees nothing needed", Resources{MemoryBytes: 150 * mib}, []int{3, 1}},
		{"one is enough", Resources{MemoryBytes: 20 * mib}, []int{3}},
		{"GPU", Resources{GPUs: 1}, []int{3}},
		{"cannot be covered: evict nothing", Resources{MemoryBytes: 1024 * mib}, nil},
		{"CPU nobody holds", Resources{MilliCPUs: 100}, nil},
	}
	for _, c := range cases {
		if got := planEviction(cands, c.short); !slices.Equal(got, c.want) {
			t.Errorf("%s: planEviction = %v; want %v", c.name, got, c.want)
		}
	}
}
