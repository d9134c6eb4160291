package fnagent

import (
	"sync"
	"time"
)

// ContainerState is where a hot container is in its life (Fn's
// ContainerStateType, less the states that belong to calls).
type ContainerState int

const (
	// ContainerNone is before creation and after removal.
	ContainerNone ContainerState = iota
	// ContainerStarting: reserved, being pulled, created, started, or
	// waited on for its socket.
	ContainerStarting
	// ContainerIdle: running, serving no call.
	ContainerIdle
	// ContainerPaused: idle and frozen.
	ContainerPaused
	// ContainerBusy: serving a call.
	ContainerBusy
	// ContainerRemoving: being removed.
	ContainerRemoving
	// ContainerPrepared: created ahead and not started, waiting for a
	// launch to take it (prepare.go); Starting again once one does.
	ContainerPrepared
)

var containerStateNames = [...]string{"none", "starting", "idle", "paused", "busy", "removing", "prepared"}

func (s ContainerState) String() string {
	if int(s) < len(containerStateNames) {
		return containerStateNames[s]
	}
	return "unknown"
}

// Metrics receives what the engine does, for counters and gauges; the node
// agent adapts it to Prometheus. It plays the part of Fn's CallListener for
// observation only: a hook here cannot refuse or alter a call. Methods are
// called synchronously from the engine's goroutines, concurrently, and must
// be quick.
type Metrics interface {
	// CallDone is called once per call, successful or not.
	CallDone(CallReport)
	// ContainerStateChanged is called on every transition; from is
	// ContainerNone when a container is created, to is ContainerNone when
	// it is gone.
	ContainerStateChanged(from, to ContainerState)
}

// Counters is a Metrics that keeps plain counts, for tests and for an
// agent without a metrics system. Safe for concurrent use.
type Counters struct {
	mu         sync.Mutex
	calls      int64
	cold       int64
	errors     map[Kind]int64
	latency    time.Duration
	containers map[ContainerState]int64
}

// CountersSnapshot is Counters at one moment; the caller owns its maps.
type CountersSnapshot struct {
	// Calls counts every call; Cold those that were their container's first.
	Calls, Cold int64
	// Errors counts failed calls by kind.
	Errors map[Kind]int64
	// Latency is the sum of all calls' durations.
	Latency time.Duration
	// Containers is the gauge of containers by state (none is absent).
	Containers map[ContainerState]int64
}

// CallDone implements Metrics.
func (c *Counters) CallDone(r CallReport) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if r.Cold {
		c.cold++
	}
	if r.Kind != "" {
		if c.errors == nil {
			c.errors = map[Kind]int64{}
		}
		c.errors[r.Kind]++
	}
	c.latency += r.Duration
}

// ContainerStateChanged implements Metrics.
func (c *Counters) ContainerStateChanged(from, to ContainerState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.containers == nil {
		c.containers = map[ContainerState]int64{}
	}
	if from != ContainerNone {
		c.containers[from]--
	}
	if to != ContainerNone {
		c.containers[to]++
	}
}

// Snapshot returns the counts now.
func (c *Counters) Snapshot() CountersSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := CountersSnapshot{Calls: c.calls, Cold: c.cold, Latency: c.latency,
		Errors: map[Kind]int64{}, Containers: map[ContainerState]int64{}}
	for k, v := range c.errors {
		s.Errors[k] = v
	}
	for k, v := range c.containers {
		if v != 0 {
			s.Containers[k] = v
		}
	}
	return s
}
