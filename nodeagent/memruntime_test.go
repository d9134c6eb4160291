package nodeagent

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeagent/runtimesim"
	"github.com/mercator/mercator/nodeproto"
)

// memRuntime is an in-memory Runtime. Its containers run the test
// workload's programs (runtimesim): "exit 3" exits 3, "sleep 60" runs and
// exits 0 at SIGTERM, "ignore-term 60" is killed after the grace period;
// any other command runs until stopped and exits 143 at SIGTERM. It
// refuses what the Docker runtime refuses (an image not pinned by digest)
// and passes the conformance suite the Docker runtime passes
// (runtime_conformance_test.go).
//
// Its daemon half refuses a second container of one name, as Docker's
// does, and the runtime half adopts the one the name identifies, as the
// Docker runtime does; launches counts every create the runtime asked of
// the daemon, adopted duplicates included, which is what the exactly-once
// tests check (a count of containers could never exceed 1, and the check
// could not fail).
type memRuntime struct {
	mu        sync.Mutex
	launches  map[nodeproto.WorkloadKey]int
	workloads map[nodeproto.WorkloadKey]*memWorkload
	failPulls int // the next failPulls PrepareImage calls fail as unavailable
}

// memWorkload is one container of a memRuntime.
type memWorkload struct {
	launch  nodeproto.LaunchWorkloadCommand
	c       runtimesim.Container
	created bool // created but not yet started (startLaterRuntime)
}

func newMemRuntime() *memRuntime {
	return &memRuntime{launches: map[nodeproto.WorkloadKey]int{}, workloads: map[nodeproto.WorkloadKey]*memWorkload{}}
}

// pinnedImage is a reference to repo pinned by a digest, as the control
// plane sends it.
func pinnedImage(repo string) string {
	return "registry.example/" + repo + "@sha256:" + strings.Repeat("ab", 32)
}

func (m *memRuntime) Facts(context.Context) (nodeproto.NodeFacts, error) {
	return nodeproto.NodeFacts{CPUs: 4, MemoryBytes: 8 << 30}, nil
}

func (m *memRuntime) PrepareImage(_ context.Context, c nodeproto.PrepareImageCommand) error {
	if err := runtimesim.CheckPinned(c.Image); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failPulls > 0 {
		m.failPulls--
		return failure.Unavailable("daemon restarting")
	}
	return nil
}

func (m *memRuntime) PrepareArtifact(context.Context, nodeproto.PrepareArtifactCommand) error {
	return nil
}

func (m *memRuntime) LaunchWorkload(_ context.Context, c nodeproto.LaunchWorkloadCommand) error {
	if err := runtimesim.CheckPinned(c.Image); err != nil {
		return err
	}
	if err := runtimesim.CheckContainment(c); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// A name conflict is adopted, as the Docker runtime adopts it.
	if err := m.create(c); err != nil && !errors.Is(err, failure.ErrConflict) {
		return err
	}
	return nil
}

// create is the daemon's half of a launch: every call is counted, and a
// second container under one name is refused. Called with mu held.
func (m *memRuntime) create(c nodeproto.LaunchWorkloadCommand) error {
	m.launches[c.WorkloadKey]++
	if _, ok := m.workloads[c.WorkloadKey]; ok {
		return failure.Conflict("container name %s-%d is already in use", c.RunID, c.Attempt)
	}
	p := runtimesim.Parse(c.Command, c.Env)
	if !p.Known {
		p = runtimesim.Program{RunFor: runtimesim.Forever, TermExit: 143}
	}
	m.workloads[c.WorkloadKey] = &memWorkload{launch: c, c: runtimesim.Container{Program: p, Started: time.Now()}}
	return nil
}

// creates is how many creates of key the runtime asked of the daemon.
func (m *memRuntime) creates(key nodeproto.WorkloadKey) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.launches[key]
}

// StopWorkload delivers SIGTERM and, to a program that ignores it, SIGKILL
// after the grace period (10 s when none is given, as the Docker
// runtime's default).
func (m *memRuntime) StopWorkload(ctx context.Context, c nodeproto.StopWorkloadCommand) error {
	m.mu.Lock()
	w, ok := m.workloads[c.WorkloadKey]
	if !ok || w.c.Term(time.Now()) {
		m.mu.Unlock()
		return nil
	}
	m.mu.Unlock()
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
	m.mu.Lock()
	defer m.mu.Unlock()
	w.c.Kill(time.Now())
	return nil
}

func (m *memRuntime) Observe(context.Context) ([]nodeproto.WorkloadObservation, error) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []nodeproto.WorkloadObservation
	for _, w := range m.workloads {
		o := nodeproto.WorkloadObservation{WorkloadKey: w.launch.WorkloadKey, ContainerID: "c-" + w.launch.RunID, Image: w.launch.Image,
			Timeout: w.launch.Timeout, Phase: nodeproto.PhaseRunning, StartedAt: &w.c.Started}
		if w.created {
			o.Phase, o.StartedAt = nodeproto.PhaseCreated, nil
		} else if exited, finished, code := w.c.State(now); exited {
			o.Phase, o.FinishedAt, o.ExitCode = nodeproto.PhaseExited, &finished, &code
		}
		out = append(out, o)
	}
	return out, nil
}
