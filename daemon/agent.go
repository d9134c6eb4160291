package daemon

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/agentupgrade"

	"github.com/mercator/mercator/artifactcache"
	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/fnagent"
	"github.com/mercator/mercator/fnagent/outputrelay"

	// Every binary with the agent in it is an output relay when started
	// as one (autoOutputRelay uses the agent's own executable).
	_ "github.com/mercator/mercator/fnagent/outputrelay/relaymain"
	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/nodeagent/dockerruntime"
	"github.com/mercator/mercator/pki"
)

// AgentOptions is what `mercator agent` is started with.
type AgentOptions struct {
	ControlPlaneURL string
	NodeID          string
	// StateDir holds the agent's state file (credential, applied
	// operations, spool) and control-plane-ca.pem, the CA it pinned.
	StateDir string
	// Invitation is the single-use token; needed only for the first
	// enrollment (or after a credential was lost).
	Invitation string
	// CAFile holds the CA certificate(s) the control plane's chain must
	// lead to, for an operator's own PKI. Without it the agent pins the CA
	// its invitation names (and keeps it in StateDir).
	CAFile string
	// DockerHost is the daemon to drive ("" = DOCKER_HOST or the local socket).
	DockerHost string
	// ArtifactRoot is where Artifact copies are kept (default
	// STATE_DIR/artifacts), and ArtifactBudget the most bytes they may
	// take there (0: the disk's free space is the only bound).
	ArtifactRoot    string
	ArtifactBudget  int64
	AcceleratorTool string
	KernelReports   string
	// KernelLog is where the GPU health sampler reads Xid reports (""
	// /dev/kmsg); GPUSampleEvery its period (0: the default).
	KernelLog      string
	GPUSampleEvery time.Duration
	// DCGMI is DCGM's tool for the quick GPU diagnostic ("" runs none);
	// GPUDiagEvery its period after the run at the start (0: the default,
	// negative: only at the start). ForgetGPUs drops the GPU inventory the
	// state kept (nodeagent.WithForgetGPUs).
	DCGMI        string
	GPUDiagEvery time.Duration
	ForgetGPUs   bool
	Heartbeat    time.Duration
	// Labels are reported with the node's facts (`--label`).
	Labels map[string]string
	Logger *slog.Logger
	// Functions configures the hot-container engine (package fnagent).
	Functions nodeagent.FunctionsOptions

	// Containment is what every Run and function container is held to
	// (docs/hardening.md, "Contained workloads"): default CPU and memory
	// for a spec that states none, the process limit and its maximum, the
	// output kept per Run container. Nil means
	// dockerengine.DefaultContainment.
	Containment *dockerengine.Containment

	// InProcess says the agent shares its process with a control plane
	// (`mercator server --local-agent`, `mercator dev`): it then never
	// upgrades itself, since replacing the binary and exec'ing it would
	// replace the control plane too; upgrade the server instead. An
	// upgrade command is refused with the reason (nodeagent).
	InProcess bool
}

// RunAgent wires one Docker client, the Docker runtime over it, the state
// file, the HTTP transport and the function engine into a node agent and
// runs it until ctx ends or the agent cannot continue. It returns once the
// function engine has removed its containers.
func RunAgent(ctx context.Context, o AgentOptions) error {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.ControlPlaneURL == "":
		return fmt.Errorf("--control-plane URL is required")
	case o.NodeID == "":
		return fmt.Errorf("--node-id is required")
	case o.StateDir == "":
		return fmt.Errorf("--state DIR is required")
	}
	if o.Containment == nil {
		c := dockerengine.DefaultContainment()
		o.Containment = &c
	}
	if err := o.Containment.Check(); err != nil {
		return fmt.Errorf("containment: %w", err)
	}
	// Trust first: a control plane that cannot be trusted is refused
	// before anything, credentials included, is sent to it.
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return err
	}
	roots, err := agentTrust(ctx, o)
	if err != nil {
		return err
	}
	// An upgrade drains the function engine just before its exec (set
	// once the engine runs; agentupgrade.Config.Quiesce).
	var drain atomic.Pointer[func()]
	var upgrade []nodeagent.Option
	if !o.InProcess {
		upgrader, err := startUpgrader(ctx, o, roots, func() {
			if f := drain.Load(); f != nil {
				(*f)()
			}
		})
		if err != nil {
			return fmt.Errorf("self-upgrade: %w", err)
		}
		upgrade = append(upgrade, nodeagent.WithUpgrader(upgrader))
	}
	rt, err := agentRuntime(o, roots)
	if err != nil {
		return fmt.Errorf("docker runtime: %w", err)
	}
	defer rt.Close()
	if err := rt.WaitReady(ctx, func(err error) {
		o.Logger.Warn("waiting for the Docker daemon", "err", err)
	}); err != nil {
		return err
	}
	state, err := nodeagent.OpenState(o.StateDir)
	if err != nil {
		return err
	}
	defer state.Close()
	hc := AgentHTTPClient(roots, nil)
	aopts := append([]nodeagent.Option{nodeagent.WithLogger(o.Logger), nodeagent.WithTLS(pki.ClientTLSConfig(roots))}, upgrade...)
	if o.Heartbeat > 0 {
		aopts = append(aopts, nodeagent.WithHeartbeat(o.Heartbeat))
	}
	aopts = append(aopts, nodeagent.WithGPUSampleEvery(o.GPUSampleEvery))
	if o.GPUDiagEvery != 0 {
		aopts = append(aopts, nodeagent.WithGPUDiagEvery(max(o.GPUDiagEvery, 0)))
	}
	if o.ForgetGPUs {
		aopts = append(aopts, nodeagent.WithForgetGPUs())
	}
	if len(o.Labels) > 0 {
		aopts = append(aopts, nodeagent.WithLabels(o.Labels))
	}
	fnOpts, stopFunctions, err := startFunctions(ctx, o, rt)
	if err != nil {
		return err
	}
	defer stopFunctions()
	drain.Store(&stopFunctions)
	aopts = append(aopts, fnOpts...)
	agent := nodeagent.New(nodeagent.Identity{ControlPlaneURL: o.ControlPlaneURL, NodeID: o.NodeID, EnrollmentToken: o.Invitation, AgentVersion: nodeagent.Version},
		rt, nodeagent.NewHTTPTransport(o.ControlPlaneURL, hc), state, aopts...)
	return agent.Run(ctx)
}

// startUpgrader is the agent's self-upgrade (package agentupgrade) over
// the running binary and its arguments; it acts on an upgrade pending from
// the previous process first (a rollback execs the previous binary now).
func startUpgrader(ctx context.Context, o AgentOptions, roots []*x509.Certificate, quiesce func()) (*agentupgrade.Upgrader, error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if bin, err = filepath.EvalSymlinks(bin); err != nil {
		return nil, err
	}
	u := agentupgrade.New(agentupgrade.Config{StateDir: o.StateDir, Binary: bin, Args: os.Args, Version: nodeagent.Version,
		Client: contentClient(roots), Logger: o.Logger.With("component", "upgrade"), Quiesce: quiesce})
	return u, u.Start(ctx)
}

// agentRuntime is the Docker runtime the options describe, labelling its
// containers with the node's ID.
// Artifact content is read from the control plane's signed URLs (its CA
// in roots) or from an object store's (the system's CAs).
func agentRuntime(o AgentOptions, roots []*x509.Certificate) (*dockerruntime.Runtime, error) {
	ropts := []dockerruntime.Option{dockerruntime.WithNodeLabel(o.NodeID), dockerruntime.WithContainment(*o.Containment)}
	if o.ArtifactRoot == "" {
		o.ArtifactRoot = filepath.Join(o.StateDir, "artifacts")
	}
	ropts = append(ropts, dockerruntime.WithArtifactRoot(o.ArtifactRoot),
		dockerruntime.WithArtifactOptions(artifactcache.Options{Budget: o.ArtifactBudget, Logger: o.Logger.With("component", "artifacts"), Client: contentClient(roots)}))
	if o.AcceleratorTool != "" {
		ropts = append(ropts, dockerruntime.WithAcceleratorTool(o.AcceleratorTool))
	}
	if o.KernelReports != "" {
		ropts = append(ropts, dockerruntime.WithKernelReports(o.KernelReports))
	}
	ropts = append(ropts, dockerruntime.WithKernelLog(o.KernelLog), dockerruntime.WithDCGMI(o.DCGMI))
	cli, err := dockerengine.NewClient(o.DockerHost)
	if err != nil {
		return nil, err
	}
	return dockerruntime.NewWithClient(cli, ropts...), nil
}

// startFunctions builds the function engine over the runtime's Docker client
// and the agent option that serves invokes with it, removing function
// containers a previous agent of this node left behind. stop closes the
// engine (removing its containers).
func startFunctions(ctx context.Context, o AgentOptions, rt *dockerruntime.Runtime) (opts []nodeagent.Option, stop func(), err error) {
	fo := o.Functions
	if fo.Disabled {
		return nil, func() {}, nil
	}
	share, err := functionShare(ctx, fo, rt)
	if err != nil {
		return nil, nil, fmt.Errorf("functions: %w", err)
	}
	if fo.SocketRoot == "" {
		fo.SocketRoot = filepath.Join(o.StateDir, "fn-sockets")
	}
	if fo.OutputRelay == OutputRelayAuto {
		fo.OutputRelay = autoOutputRelay(o.Logger)
	}
	engine, err := fnagent.New(fnagent.Config{
		Docker:      rt.API(),
		NodeID:      o.NodeID,
		SocketRoot:  fo.SocketRoot,
		Network:     fo.Network,
		MaxSpares:   fo.Spares,
		NetnsPool:   fo.NetnsPool,
		OutputRelay: fo.OutputRelay,
		Containment: o.Containment,
		Tracker:     fnagent.NewResourceTracker(fnagent.Capacity{MemoryBytes: share.MemoryBytes, MilliCPUs: share.MilliCPUs, GPUs: share.GPUs}),
		Logger:      o.Logger.With("component", "functions"),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("functions: %w", err)
	}
	if n, err := engine.RemoveOrphans(ctx); err != nil {
		o.Logger.Warn("remove function containers a previous agent left", "err", err)
	} else if n > 0 {
		o.Logger.Info("removed function containers a previous agent left", "count", n)
	}
	o.Logger.Info("functions share", "memory_bytes", share.MemoryBytes, "milli_cpus", share.MilliCPUs, "gpus", share.GPUs)
	stop = func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := engine.Close(closeCtx); err != nil {
			o.Logger.Warn("close the functions engine", "err", err)
		}
	}
	return []nodeagent.Option{nodeagent.WithFunctions(engine, share)}, stop, nil
}

// autoOutputRelay is --fn-output-relay's "auto": this agent's own
// executable, which every binary with the agent in it can be (relaymain),
// when it is statically linked; "" (the output through the daemon, as
// before the relay) otherwise, said once in the log with what to do. A
// daemon that cannot mount the path (an agent in a container of its own,
// whose paths the daemon's machine does not share) turns the relay off at
// the first container (fnagent.Config.OutputRelay).
func autoOutputRelay(log *slog.Logger) string {
	off := func(reason string, args ...any) string {
		log.Info("function output goes through the Docker daemon, not the output relay (--fn-output-relay)", append([]any{"reason", reason}, args...)...)
		return ""
	}
	exe, err := os.Executable()
	if err != nil {
		return off("this agent's executable is unknown", "err", err)
	}
	if err := outputrelay.CheckStatic(exe); err != nil {
		return off(err.Error())
	}
	return exe
}

// functionShare is what the options set aside for functions: a quarter of
// the machine's memory and CPU unless stated, and the last fo.GPUs of the
// accelerators the runtime reports.
func functionShare(ctx context.Context, fo nodeagent.FunctionsOptions, rt nodeagent.Runtime) (nodeagent.FunctionShare, error) {
	detected, err := fnagent.DetectCapacity(0)
	if err != nil {
		return nodeagent.FunctionShare{}, err
	}
	share := nodeagent.FunctionShare{MemoryBytes: fo.MemoryBytes, MilliCPUs: fo.MilliCPUs}
	if share.MemoryBytes <= 0 {
		share.MemoryBytes = detected.MemoryBytes / 4
	}
	if share.MilliCPUs <= 0 {
		share.MilliCPUs = detected.MilliCPUs / 4
	}
	if fo.GPUs <= 0 {
		return share, nil
	}
	factsCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	facts, err := rt.Facts(factsCtx)
	cancel()
	if err != nil {
		return nodeagent.FunctionShare{}, fmt.Errorf("read the accelerators to set %d aside: %w", fo.GPUs, err)
	}
	if len(facts.Accelerators) < fo.GPUs {
		return nodeagent.FunctionShare{}, fmt.Errorf("%d GPUs asked for, this machine has %d", fo.GPUs, len(facts.Accelerators))
	}
	for _, g := range facts.Accelerators[len(facts.Accelerators)-fo.GPUs:] {
		share.GPUs = append(share.GPUs, g.UUID)
	}
	return share, nil
}
