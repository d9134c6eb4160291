package fleetsim

import (
	"context"
	"crypto/x509"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/nodeproto"
)

// fleetSpec is what runs a group of simulated agents: the whole fleet in
// this process, or one shard of it in a child process (it travels there as
// JSON).
type fleetSpec struct {
	Replicas []string `json:"replicas"` // host:port of each replica
	First    int      `json:"first"`    // the fleet index of IDs[0]
	IDs      []string `json:"ids"`
	Tokens   []string `json:"tokens"`
	Dir      string   `json:"dir"`

	Heartbeat    time.Duration `json:"heartbeat"`
	ObserveEvery time.Duration `json:"observe_every"`
	StartTime    time.Duration `json:"start_time"`
	RunTime      time.Duration `json:"run_time"`
	NodeCPUs     float64       `json:"node_cpus"`
	NodeMemory   int64         `json:"node_memory"`
	NoFsync      bool          `json:"no_fsync"`
	HTTP2        bool          `json:"http2"`
	// CAFile is the run's CA, which every invitation pins; "" means the
	// replicas speak plain HTTP.
	CAFile            string `json:"ca_file,omitempty"`
	EnrollConcurrency int    `json:"enroll_concurrency"`
	// CPUProfile, in a shard's spec, is a file for that shard's CPU
	// profile over its whole life (Config.CPUProfile + ".agents.N").
	CPUProfile string `json:"cpu_profile,omitempty"`
}

// runAgents runs spec's agents, reporting to sink, until ctx ends; it
// returns once every agent has returned and its state file is closed. At
// most spec.EnrollConcurrency agents are enrolling at any moment. Node n of
// the spec (fleet index spec.First+n) talks to replica (First+n) mod
// len(Replicas), or the next one that answers.
func runAgents(ctx context.Context, spec fleetSpec, sink sink, log slog.Handler) error {
	router := newRouter(spec.Replicas)
	obs := &observer{router: router, sink: sink, index: map[string]int{}, bad: new(atomic.Int64)}
	for i, id := range spec.IDs {
		obs.index[id] = spec.First + i
	}
	scheme := "http://"
	var roots []*x509.Certificate
	if spec.CAFile != "" {
		var err error
		if roots, err = agentTrust(spec.CAFile, spec.Tokens); err != nil {
			return err
		}
		scheme = "https://"
	}
	clients := newAgentClients(router, spec.HTTP2, roots, obs)
	defer clients.closeIdle()
	var stateOpts []nodeagent.StateOption
	if spec.NoFsync {
		stateOpts = append(stateOpts, nodeagent.WithoutFsync())
	}
	states := make([]*nodeagent.State, len(spec.IDs))
	defer func() {
		for _, s := range states {
			if s != nil {
				s.Close()
			}
		}
	}()
	if err := parallel(ctx, 8, len(spec.IDs), func(i int) error {
		s, err := nodeagent.OpenState(filepath.Join(spec.Dir, spec.IDs[i]), stateOpts...)
		states[i] = s
		return err
	}); err != nil {
		return err
	}
	sem := make(chan struct{}, spec.EnrollConcurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, id := range spec.IDs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		n := spec.First + i
		var once sync.Once
		release := func() { once.Do(func() { <-sem }) }
		base := scheme + replicaHost(n%len(spec.Replicas))
		rt := NewRuntime(id, RuntimeConfig{CPUs: spec.NodeCPUs, MemoryBytes: spec.NodeMemory, StartTime: spec.StartTime, RunTime: spec.RunTime},
			func(key nodeproto.WorkloadKey, at time.Time) { sink.launched(n, key, at) })
		hc := clients.next()
		tr := &simTransport{inner: nodeagent.NewHTTPTransport(base, hc), sink: sink, n: n, release: release}
		// start runs an agent of version v on the node's state; an
		// upgrade replaces it by one of the new version (upgrade.go).
		start := func(ctx context.Context, v string, restart chan<- string) <-chan error {
			up := &simUpgrader{version: v, base: base, client: hc, restart: restart}
			agent := nodeagent.New(nodeagent.Identity{ControlPlaneURL: base, NodeID: id, EnrollmentToken: spec.Tokens[i], AgentVersion: v},
				rt, tr, states[i], nodeagent.WithHeartbeat(spec.Heartbeat), nodeagent.WithObserveInterval(spec.ObserveEvery),
				nodeagent.WithLogger(slog.New(log)), nodeagent.WithUpgrader(up))
			done := make(chan error, 1)
			go func() { done <- agent.Run(ctx) }()
			return done
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer release()
			if err := runUpgradable(ctx, start); err != nil && ctx.Err() == nil {
				sink.agentStopped(n, err)
			}
		}()
	}
	<-ctx.Done()
	return nil
}

// runUpgradable runs a node's agent (start), replacing it by one of the
// new version each time it upgrades, until one returns; a replaced agent is
// left blocked in its upgrade, as a real one is gone in its exec, and its
// context is cancelled so its loops stop.
func runUpgradable(ctx context.Context, start func(ctx context.Context, version string, restart chan<- string) <-chan error) error {
	version := simVersion
	for {
		actx, cancel := context.WithCancel(ctx)
		restart := make(chan string, 1)
		done := start(actx, version, restart)
		select {
		case err := <-done:
			cancel()
			return err
		case version = <-restart:
			cancel()
		}
	}
}
