package fleetsim

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeagent/runtimesim"
	"github.com/mercator/mercator/nodeproto"
)

// RuntimeConfig is what a simulated machine pretends to be and how its
// containers behave.
type RuntimeConfig struct {
	// CPUs and MemoryBytes are the capacity the node reports in its facts.
	CPUs        float64
	MemoryBytes int64
	// StartTime is how long a launch takes: LaunchWorkload returns after
	// it, with the container running, as the Docker runtime's returns once
	// the daemon created and started the container.
	StartTime time.Duration
	// RunTime is how long a container runs before it exits with code 0;
	// zero means it runs until stopped. A stop ends it at once with 137.
	// A command of the test workload image ("exit 3", "sleep 60"; see
	// package runtimesim) behaves as that program instead, which is how
	// this runtime passes the conformance suite the Docker runtime passes.
	RunTime time.Duration
}

// Runtime is an in-memory nodeagent.Runtime: it pretends to pull images and
// run containers, with the start and run times of its RuntimeConfig, and
// tells its onLaunch callback about every launch it performs. It refuses
// what the Docker runtime refuses: an image not pinned by digest. It also
// implements nodeagent.ChangeSource, so the agent observes a container's
// start and exit the moment they happen, as it does with Docker's event
// stream. It keeps every workload it ever launched, exited ones included
// (they are what Observe reports an exit from).
//
// Safe for concurrent use, as the Runtime contract requires.
type Runtime struct {
	nodeID   string
	cfg      RuntimeConfig
	onLaunch func(nodeproto.WorkloadKey, time.Time)

	mu        sync.Mutex
	images    map[string]bool
	workloads map[nodeproto.WorkloadKey]*workload
	changes   chan struct{}
}

type workload struct {
	key     nodeproto.WorkloadKey
	id      string
	image   string
	timeout time.Duration
	c       runtimesim.Container
}

// NewRuntime returns a simulated machine called nodeID. onLaunch, when not
// nil, is called at every LaunchWorkload, adoptions included.
func NewRuntime(nodeID string, cfg RuntimeConfig, onLaunch func(key nodeproto.WorkloadKey, at time.Time)) *Runtime {
	return &Runtime{nodeID: nodeID, cfg: cfg, onLaunch: onLaunch,
		images: map[string]bool{}, workloads: map[nodeproto.WorkloadKey]*workload{},
		changes: make(chan struct{}, 1)}
}

// Facts implements nodeagent.Runtime.
func (r *Runtime) Facts(ctx context.Context) (nodeproto.NodeFacts, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := nodeproto.NodeFacts{Hostname: r.nodeID, OS: "linux", Arch: "amd64", CPUs: r.cfg.CPUs, MemoryBytes: r.cfg.MemoryBytes,
		DiskFreeBytes: 1 << 40, RuntimeName: "fleetsim", RuntimeVersion: "1", RuntimeAPIVersion: "1",
		Notes: []string{"simulated by fleetsim: no container runs here"}}
	for img := range r.images {
		f.Images = append(f.Images, img)
	}
	sort.Strings(f.Images)
	return f, nil
}

// PrepareImage implements nodeagent.Runtime: a pinned image is held at
// once.
func (r *Runtime) PrepareImage(ctx context.Context, c nodeproto.PrepareImageCommand) error {
	if err := runtimesim.CheckPinned(c.Image); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.images[c.Image] = true
	return nil
}

// PrepareArtifact implements nodeagent.Runtime: the simulation holds no
// artifacts.
func (r *Runtime) PrepareArtifact(ctx context.Context, c nodeproto.PrepareArtifactCommand) error {
	return failure.Invalid("prepare_artifact", "the fleet simulator does not simulate artifacts")
}

// LaunchWorkload implements nodeagent.Runtime. A launch of a workload this
// runtime already holds adopts it, as the Docker runtime adopts the
// container its name identifies; onLaunch still hears of it, which is how
// the simulator catches a command performed twice.
func (r *Runtime) LaunchWorkload(ctx context.Context, c nodeproto.LaunchWorkloadCommand) error {
	if err := runtimesim.CheckPinned(c.Image); err != nil {
		return err
	}
	if err := runtimesim.CheckContainment(c); err != nil {
		return err
	}
	if r.onLaunch != nil {
		r.onLaunch(c.WorkloadKey, time.Now())
	}
	r.mu.Lock()
	_, held := r.workloads[c.WorkloadKey]
	r.mu.Unlock()
	if held {
		return nil
	}
	if r.cfg.StartTime > 0 {
		t := time.NewTimer(r.cfg.StartTime)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.workloads[c.WorkloadKey]; ok {
		return nil
	}
	p := runtimesim.Parse(c.Command, c.Env)
	if !p.Known {
		p = runtimesim.Program{Known: true, RunFor: runtimesim.Forever, TermExit: runtimesim.KilledExit}
		if r.cfg.RunTime > 0 {
			p.RunFor = r.cfg.RunTime
		}
	}
	w := &workload{key: c.WorkloadKey, id: fmt.Sprintf("sim-%s-%d", c.RunID, c.Attempt), image: c.Image, timeout: c.Timeout,
		c: runtimesim.Container{Program: p, Started: now}}
	r.workloads[c.WorkloadKey] = w
	go r.changed()
	if p.RunFor != runtimesim.Forever {
		time.AfterFunc(p.RunFor, r.changed)
	}
	return nil
}

// StopWorkload implements nodeagent.Runtime: the simulated container
// exits at once with 137, as one killed would, and a program of the test
// workload as it does at SIGTERM (one that ignores it is killed after the
// grace period, 10 s when none is given, as the Docker runtime's default);
// stopping one that is gone succeeds.
func (r *Runtime) StopWorkload(ctx context.Context, c nodeproto.StopWorkloadCommand) error {
	now := time.Now()
	r.mu.Lock()
	w, ok := r.workloads[c.WorkloadKey]
	if !ok {
		r.mu.Unlock()
		return nil
	}
	if exited, _, _ := w.c.State(now); exited {
		r.mu.Unlock()
		return nil
	}
	if w.c.Term(now) {
		r.mu.Unlock()
		go r.changed()
		return nil
	}
	r.mu.Unlock()
	grace := c.GracePeriod
	if grace <= 0 {
		grace = 10 * time.Second
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	r.mu.Lock()
	w.c.Kill(time.Now())
	r.mu.Unlock()
	go r.changed()
	return nil
}

// Observe implements nodeagent.Runtime.
func (r *Runtime) Observe(ctx context.Context) ([]nodeproto.WorkloadObservation, error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]nodeproto.WorkloadObservation, 0, len(r.workloads))
	for _, w := range r.workloads {
		o := nodeproto.WorkloadObservation{WorkloadKey: w.key, ContainerID: w.id, Image: w.image, Timeout: w.timeout,
			Phase: nodeproto.PhaseRunning, StartedAt: &w.c.Started}
		if exited, finished, code := w.c.State(now); exited {
			o.Phase, o.ExitCode, o.FinishedAt = nodeproto.PhaseExited, &code, &finished
		}
		out = append(out, o)
	}
	return out, nil
}

// Changes implements nodeagent.ChangeSource.
func (r *Runtime) Changes(ctx context.Context) <-chan struct{} { return r.changes }

func (r *Runtime) changed() {
	select {
	case r.changes <- struct{}{}:
	default:
	}
}

// Launches records every launch the simulated runtimes perform, by node and
// workload, so the simulator can check that each attempt was launched
// exactly once. Safe for concurrent use.
type Launches struct {
	mu     sync.Mutex
	counts map[nodeproto.WorkloadKey]int
	at     map[nodeproto.WorkloadKey]time.Time
}

// NewLaunches returns an empty recorder.
func NewLaunches() *Launches {
	return &Launches{counts: map[nodeproto.WorkloadKey]int{}, at: map[nodeproto.WorkloadKey]time.Time{}}
}

func (l *Launches) launched(key nodeproto.WorkloadKey, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts[key]++
	if _, ok := l.at[key]; !ok {
		l.at[key] = at
	}
}

// Count is how often the attempt was launched.
func (l *Launches) Count(key nodeproto.WorkloadKey) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[key]
}

// Duplicates is how many attempts were launched more than once.
func (l *Launches) Duplicates() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.counts {
		if c > 1 {
			n++
		}
	}
	return n
}
