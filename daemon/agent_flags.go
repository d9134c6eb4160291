package daemon

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/fnagent"
	"github.com/mercator/mercator/hostfacts"
	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/nodeagent"
)

// AgentFlags declares `mercator agent`'s flags on fs and returns a
// function that gives, once fs is parsed, the options they set (the
// invitation read from --token-file). As with ServerFlags, an option and
// its flag land in one place. Logger is the caller's.
func AgentFlags(fs *flag.FlagSet) func() (AgentOptions, error) {
	var o AgentOptions
	fs.StringVar(&o.ControlPlaneURL, "control-plane", "", "control plane `URL` (https://HOST:PORT)")
	fs.StringVar(&o.CAFile, "ca-file", "", "`file` of the CA certificate(s) the control plane's chain must lead to (default: the CA the invitation pins)")
	fs.StringVar(&o.NodeID, "node-id", "", "this machine's node `ID`, as invited")
	tokenFile := fs.String("token-file", "", "`file` holding the invitation (mode 0600); needed for the first enrollment")
	machine := machineFlags(fs, "", &o)
	return func() (AgentOptions, error) {
		if o.ControlPlaneURL == "" || o.NodeID == "" {
			return o, errors.New("--control-plane and --node-id are required")
		}
		if *tokenFile != "" {
			inv, err := nodeagent.ReadTokenFile(*tokenFile)
			if err != nil {
				return o, err
			}
			o.Invitation = inv
		}
		return o, machine()
	}
}

// LocalAgentPrefix begins the names of `mercator server`'s flags for the
// agent it runs in its own process (--local-agent): --agent-fn-memory is
// `mercator agent`'s --fn-memory.
const LocalAgentPrefix = "agent-"

// LocalAgentFlags declares, on `mercator server`'s fs, the flags of an
// agent run in the server's process: every one of `mercator agent`'s that
// says what the machine offers and how work on it is held (named with
// LocalAgentPrefix), none of those that say how to reach and trust the
// control plane, which the server knows. The options returned lack the
// node, the control plane and the invitation (LocalAgent fills them).
func LocalAgentFlags(fs *flag.FlagSet) func() (AgentOptions, error) {
	var o AgentOptions
	machine := machineFlags(fs, LocalAgentPrefix, &o)
	return func() (AgentOptions, error) { return o, machine() }
}

// machineFlags declares the agent's flags about the machine and its work
// (state, Docker, Artifacts, GPUs, labels, functions, containment), each
// named prefix+name, into o; the function returned completes and checks
// them once fs is parsed, its errors naming the flags as declared.
func machineFlags(fs *flag.FlagSet, prefix string, o *AgentOptions) func() error {
	name := func(s string) string { return prefix + s }
	fs.StringVar(&o.StateDir, name("state"), "/var/lib/mercator/agent", "`directory` for the agent's durable state")
	fs.StringVar(&o.DockerHost, name("docker-host"), "", "Docker daemon `address` (default $DOCKER_HOST or the local socket)")
	fs.StringVar(&o.ArtifactRoot, name("artifact-root"), "", "`directory` for artifact copies (default STATE/artifacts)")
	fs.Var((*bytesize.Value)(&o.ArtifactBudget), name("artifact-budget"), "most `size` Artifact copies may take under the root, e.g. 500GiB; least recently used copies no work uses are evicted (default: the disk's free space)")
	fs.StringVar(&o.AcceleratorTool, name("accelerator-tool"), "", "`path` of the GPU vendor tool (default nvidia-smi on PATH)")
	fs.StringVar(&o.KernelReports, name("kernel-reports"), "", "`root` of the kernel's reports (default /proc)")
	fs.StringVar(&o.KernelLog, name("kernel-log"), "", "kernel message log `path` the GPU health sampler reads Xids from (default /dev/kmsg)")
	fs.DurationVar(&o.GPUSampleEvery, name("gpu-sample-every"), nodeagent.DefaultGPUSampleEvery, "how often to sample each GPU's health through the accelerator tool")
	fs.StringVar(&o.DCGMI, name("dcgmi"), hostfacts.DefaultDCGMI, "`path` of DCGM's dcgmi, through which the agent runs the quick GPU diagnostic (dcgmi diag -r 1) at its start and every --"+name("gpu-diag-every")+"; \"\" runs none (a dcgmi not found is a note in the node's facts)")
	fs.DurationVar(&o.GPUDiagEvery, name("gpu-diag-every"), nodeagent.DefaultGPUDiagEvery, "how often to run the GPU diagnostic after the run at the agent's start; 0: only at the start")
	fs.BoolVar(&o.ForgetGPUs, name("forget-gpus"), false, "forget the GPUs this node listed before (the state keeps them so a vanished card stays reported missing); for a card taken out for good")
	fs.DurationVar(&o.Heartbeat, name("heartbeat"), 0, "how often to report liveness and facts (default 5s, and at most a third of the lease)")
	var labels []string
	fs.Func(name("label"), "a node label `KEY=VALUE` runs' constraints and projects' pools select on, e.g. pool=secure (repeatable)", func(s string) error {
		labels = append(labels, s)
		return nil
	})
	functions := functionFlags(fs, prefix)
	o.Containment = containmentFlags(fs, prefix)
	return func() error {
		if o.ArtifactRoot == "" {
			o.ArtifactRoot = filepath.Join(o.StateDir, "artifacts")
		}
		if o.GPUSampleEvery < time.Second || o.GPUSampleEvery > time.Hour {
			return fmt.Errorf("--%s %s: must be from 1s to 1h (each sample runs the accelerator tool; the default is %s)", name("gpu-sample-every"), o.GPUSampleEvery, nodeagent.DefaultGPUSampleEvery)
		}
		switch {
		case o.GPUDiagEvery == 0:
			o.GPUDiagEvery = -1 // AgentOptions' "only at the start"
		case o.GPUDiagEvery < 10*time.Minute || o.GPUDiagEvery > 30*24*time.Hour:
			return fmt.Errorf("--%s %s: must be 0 (only at the start) or from 10m to 720h (the default is %s)", name("gpu-diag-every"), o.GPUDiagEvery, nodeagent.DefaultGPUDiagEvery)
		}
		var err error
		if o.Labels, err = parseLabels("--"+name("label"), labels); err != nil {
			return err
		}
		o.Functions, err = functions()
		return err
	}
}

// maxFnSpares bounds --fn-spares: each is a container record the daemon
// keeps.
const maxFnSpares = 1000

// maxFnNetnsPool bounds --fn-netns-pool: each is a running container (6 MiB
// at most) and a network namespace with its interface on the bridge.
const maxFnNetnsPool = 64

// functionFlags declares the flags of the share of the machine set aside
// for functions (nodeagent.FunctionsOptions).
func functionFlags(fs *flag.FlagSet, prefix string) func() (nodeagent.FunctionsOptions, error) {
	name := func(s string) string { return prefix + s }
	disabled := fs.Bool(name("no-functions"), false, "run no functions on this node")
	var memory bytesize.Value
	fs.Var(&memory, name("fn-memory"), "memory `size` set aside for function containers, e.g. 4GiB (default a quarter of the machine's)")
	cpus := fs.Float64(name("fn-cpus"), 0, "CPU `cores` set aside for functions that reserve CPU (default a quarter of the machine's)")
	gpus := fs.Int(name("fn-gpus"), 0, "GPUs set aside for functions (the last ones the vendor tool lists)")
	network := fs.String(name("fn-network"), "", "Docker `network` of function containers (default the daemon's bridge)")
	spares := fs.Int(name("fn-spares"), fnagent.DefaultMaxSpares, "most functions without a minimum that keep a `count` of one prepared (created, not started) container here, for a faster cold start; 0 for none")
	netnsPool := fs.Int(name("fn-netns-pool"), fnagent.DefaultNetnsPool, "`count` of network namespaces kept ready (each a tiny holder container) for cold starts on a bridge network to join; 0 for none")
	relay := fs.String(name("fn-output-relay"), OutputRelayAuto, "statically linked mercator `binary` mounted into function containers to carry their output past the Docker daemon: "+
		"a path on the daemon's machine, \""+OutputRelayAuto+"\" for this agent's own executable when it is static (CGO_ENABLED=0), or \""+outputRelayOff+"\"")
	return func() (nodeagent.FunctionsOptions, error) {
		o := nodeagent.FunctionsOptions{Disabled: *disabled, GPUs: *gpus, Network: *network, MilliCPUs: int64(math.Round(*cpus * 1000)),
			MemoryBytes: int64(memory), Spares: *spares, NetnsPool: *netnsPool}
		var err error
		if o.OutputRelay, err = outputRelay("--"+name("fn-output-relay"), *relay); err != nil {
			return o, err
		}
		if *cpus < 0 || *gpus < 0 {
			return o, fmt.Errorf("--%s and --%s must not be negative", name("fn-cpus"), name("fn-gpus"))
		}
		switch {
		case *spares < 0 || *spares > maxFnSpares:
			return o, fmt.Errorf("--%s %d: must be from 0 (none) to %d", name("fn-spares"), *spares, maxFnSpares)
		case *spares == 0:
			o.Spares = -1 // nodeagent's "none"; its 0 is the default
		}
		switch {
		case *netnsPool < 0 || *netnsPool > maxFnNetnsPool:
			return o, fmt.Errorf("--%s %d: must be from 0 (none) to %d", name("fn-netns-pool"), *netnsPool, maxFnNetnsPool)
		case *netnsPool == 0:
			o.NetnsPool = -1 // fnagent's "none"; its 0 is the default
		}
		return o, nil
	}
}

// The values of --fn-output-relay that name no path. OutputRelayAuto is
// also nodeagent.FunctionsOptions.OutputRelay's, resolved when the agent
// starts (autoOutputRelay).
const (
	OutputRelayAuto = "auto"
	outputRelayOff  = "off"
)

// outputRelay resolves --fn-output-relay to fnagent.Config.OutputRelay:
// "off" is none; a path must be absolute (the daemon mounts it) and is
// checked when the engine starts; "auto" is this agent's executable when it
// is statically linked, none when it is not (said when the engine starts,
// autoOutputRelay). Every binary with the agent in it is a relay
// (relaymain), so the agent's own executable always is one.
func outputRelay(flagName, value string) (string, error) {
	switch {
	case value == outputRelayOff:
		return "", nil
	case value == OutputRelayAuto:
		return OutputRelayAuto, nil
	case !filepath.IsAbs(value):
		return "", fmt.Errorf("%s %q: want an absolute path, %q or %q", flagName, value, OutputRelayAuto, outputRelayOff)
	}
	return filepath.Clean(value), nil
}

// containmentFlags declares the flags of what every workload container is
// held to (dockerengine.Containment; docs/hardening.md, "Contained
// workloads"), defaulting to dockerengine.DefaultContainment. The agent
// checks the result before it starts (RunAgent).
func containmentFlags(fs *flag.FlagSet, prefix string) *dockerengine.Containment {
	name := func(s string) string { return prefix + s }
	c := dockerengine.DefaultContainment()
	fs.Float64Var(&c.DefaultCPU, name("default-cpu"), c.DefaultCPU, "CPU `cores` of a Run or function that states none (0: no quota)")
	fs.Var((*bytesize.Value)(&c.DefaultMemoryBytes), name("default-memory"), "memory `size` limit of a Run that states none (0: no limit)")
	fs.Int64Var(&c.PidsLimit, name("default-pids"), c.PidsLimit, "most `processes` a workload container may have unless its Run asks for more")
	fs.Int64Var(&c.MaxPidsLimit, name("max-pids"), c.MaxPidsLimit, "most `processes` a Run may ask for (--pids-limit)")
	fs.Var((*bytesize.Value)(&c.LogMaxBytes), name("workload-log-size"), "most `size` of a Run container's output kept on this node's disk")
	return &c
}

// parseLabels reads --label KEY=VALUE flags, checked as an operator's
// labels are (api.ValidateLabels).
func parseLabels(flagName string, flags []string) (map[string]string, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, f := range flags {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("%s %q: write KEY=VALUE, such as pool=secure", flagName, f)
		}
		out[k] = v
	}
	if err := api.ValidateLabels(flagName, out); err != nil {
		return nil, err
	}
	return out, nil
}
