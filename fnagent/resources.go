package fnagent

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"
)

// Resources is an amount of the things a container reserves.
type Resources struct {
	MemoryBytes int64
	// MilliCPUs are thousandths of a core.
	MilliCPUs int64
	// GPUs is a number of whole accelerators.
	GPUs int
}

func (r Resources) String() string {
	return fmt.Sprintf("%d MiB memory, %d mCPU, %d GPUs", r.MemoryBytes>>20, r.MilliCPUs, r.GPUs)
}

// covers reports whether r is at least need in every dimension.
func (r Resources) covers(need Resources) bool {
	return r.MemoryBytes >= need.MemoryBytes && r.MilliCPUs >= need.MilliCPUs && r.GPUs >= need.GPUs
}

// Capacity is what a tracker hands out: usable memory (after headroom), CPU,
// and the IDs of the accelerators (UUIDs for NVIDIA), so a reservation says
// which cards a container gets, not only how many.
type Capacity struct {
	MemoryBytes int64
	MilliCPUs   int64
	GPUs        []string
}

// ResourceTracker reserves memory, CPU and GPUs for containers before they
// start (Fn's ResourceTracker), so the engine never launches a container
// the machine cannot hold and the kernel's OOM killer never has to choose
// between functions. It is pure bookkeeping: it reads nothing and waits on
// nothing. A reservation that does not fit fails at once; waiting for
// capacity, and evicting idle containers to make it, is the engine's
// business, which is what lets a NoWait call answer busy without blocking.
//
// Safe for concurrent use.
type ResourceTracker struct {
	mu       sync.Mutex
	capacity Capacity
	used     Resources
	gpuUsed  map[string]bool
	changed  chan struct{}
}

// NewResourceTracker tracks reservations against c. The tracker keeps its
// own copy of c.GPUs.
func NewResourceTracker(c Capacity) *ResourceTracker {
	c.GPUs = slices.Clone(c.GPUs)
	return &ResourceTracker{capacity: c, gpuUsed: map[string]bool{}, changed: make(chan struct{})}
}

// Capacity returns what the tracker hands out; the caller owns the copy.
func (t *ResourceTracker) Capacity() Capacity {
	c := t.capacity
	c.GPUs = slices.Clone(c.GPUs)
	return c
}

func (t *ResourceTracker) capacityResources() Resources {
	return Resources{MemoryBytes: t.capacity.MemoryBytes, MilliCPUs: t.capacity.MilliCPUs, GPUs: len(t.capacity.GPUs)}
}

// Possible reports whether r could ever be reserved: it fits an empty
// machine.
func (t *ResourceTracker) Possible(r Resources) bool {
	return t.capacityResources().covers(r)
}

// Free is what is not reserved now.
func (t *ResourceTracker) Free() Resources {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.freeLocked()
}

func (t *ResourceTracker) freeLocked() Resources {
	c := t.capacityResources()
	return Resources{MemoryBytes: c.MemoryBytes - t.used.MemoryBytes, MilliCPUs: c.MilliCPUs - t.used.MilliCPUs, GPUs: c.GPUs - t.used.GPUs}
}

// Shortfall is how much more would have to be free for r to fit now; zero
// in every dimension when it fits.
func (t *ResourceTracker) Shortfall(r Resources) Resources {
	t.mu.Lock()
	defer t.mu.Unlock()
	free := t.freeLocked()
	return Resources{
		MemoryBytes: max(0, r.MemoryBytes-free.MemoryBytes),
		MilliCPUs:   max(0, r.MilliCPUs-free.MilliCPUs),
		GPUs:        max(0, r.GPUs-free.GPUs),
	}
}

// TryReserve reserves r if it fits now, choosing r.GPUs free accelerators
// in capacity order. It never blocks.
func (t *ResourceTracker) TryReserve(r Resources) (*Reservation, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.freeLocked().covers(r) {
		return nil, false
	}
	res := &Reservation{tracker: t, resources: r}
	for _, id := range t.capacity.GPUs {
		if len(res.gpus) == r.GPUs {
			break
		}
		if !t.gpuUsed[id] {
			t.gpuUsed[id] = true
			res.gpus = append(res.gpus, id)
		}
	}
	t.used.MemoryBytes += r.MemoryBytes
	t.used.MilliCPUs += r.MilliCPUs
	t.used.GPUs += r.GPUs
	return res, true
}

// Changed returns a channel closed the next time a reservation is released.
// Take it before checking, then wait on it, so no release is missed.
func (t *ResourceTracker) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

// Reservation is resources held for one container until Release.
type Reservation struct {
	tracker   *ResourceTracker
	resources Resources
	gpus      []string
	once      sync.Once
}

// Resources is what is held.
func (r *Reservation) Resources() Resources { return r.resources }

// GPUs are the IDs of the accelerators held; the caller owns the copy.
func (r *Reservation) GPUs() []string { return slices.Clone(r.gpus) }

// Release returns what is held. Releasing twice is harmless.
func (r *Reservation) Release() {
	r.once.Do(func() {
		t := r.tracker
		t.mu.Lock()
		t.used.MemoryBytes -= r.resources.MemoryBytes
		t.used.MilliCPUs -= r.resources.MilliCPUs
		t.used.GPUs -= r.resources.GPUs
		for _, id := range r.gpus {
			delete(t.gpuUsed, id)
		}
		close(t.changed)
		t.changed = make(chan struct{})
		t.mu.Unlock()
	})
}

// evictionCandidate is one idle container another function could have.
type evictionCandidate struct {
	resources Resources
	idleSince time.Time
}

// planEviction chooses which idle containers to remove to free short: the
// least recently used first, skipping any that free nothing still lacking.
// It returns their indexes in cands, or nil when removing every useful one
// would still not be enough, because evicting a warm container and then not
// launching anyway is the worst of both.
func planEviction(cands []evictionCandidate, short Resources) []int {
	if (short == Resources{}) {
		return nil
	}
	order := make([]int, len(cands))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return cands[order[a]].idleSince.Before(cands[order[b]].idleSince) })
	var freed Resources
	var chosen []int
	for _, i := range order {
		if freed.covers(short) {
			break
		}
		r := cands[i].resources
		useful := freed.MemoryBytes < short.MemoryBytes && r.MemoryBytes > 0 ||
			freed.MilliCPUs < short.MilliCPUs && r.MilliCPUs > 0 ||
			freed.GPUs < short.GPUs && r.GPUs > 0
		if !useful {
			continue
		}
		chosen = append(chosen, i)
		freed.MemoryBytes += r.MemoryBytes
		freed.MilliCPUs += r.MilliCPUs
		freed.GPUs += r.GPUs
	}
	if !freed.covers(short) {
		return nil
	}
	return chosen
}
