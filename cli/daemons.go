package cli

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/devenv"
	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/internal/termtext"
	"github.com/mercator/mercator/nodeagent"
)

// This file holds the long-running commands: server, agent and dev. Each is
// flags and wiring only; the work is in daemon.RunServer, nodeagent.Run and
// devenv.Run, which end-to-end tests call directly.

func init() {
	register(&command{name: "server", summary: "Run the control plane", run: runServer})
	register(&command{name: "agent", summary: "Run the node agent on this machine", run: runAgent})
	register(&command{name: "dev", summary: "Run a control plane, a local agent and a registry on loopback, with embedded defaults", run: runDev})
}

func (inv *invocation) logger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level must be debug, info, warn or error, not %q", level)
	}
	return slog.New(slog.NewTextHandler(inv.stderr, &slog.HandlerOptions{Level: l})), nil
}

func runServer(ctx context.Context, inv *invocation, args []string) error {
	fs := inv.flags("[flags]", `Run the control plane: the public API, the node protocol and the scheduler.

On first start it creates an admin credential, the named token "admin",
writes it (mode 0600) to DATA_DIR/admin-token and prints the path; give it
to the CLI with --token-file or MERCATOR_TOKEN, and make narrower ones with
`+"`mercator token create`"+`.

It serves HTTPS. Without --tls-cert it creates its own CA on first start
(DATA_DIR/ca.pem, key DATA_DIR/ca-key.pem) and a certificate for the listen
address, loopback and the --public-url host, renewed well before it expires
without a restart; it prints the CA's path and SHA-256 fingerprint.
Invitations carry that fingerprint, so agents need no CA file; give the CLI
the CA with `+"`mercator context add … --ca-file DATA_DIR/ca.pem`"+` or
--ca-fingerprint. Replicas sharing PostgreSQL share one CA: give every
replica the same --tls-ca-cert and --tls-ca-key (`+"`mercator ca create DIR`"+`),
or the same --tls-cert and --tls-key. Plain HTTP only with --insecure-http,
on a loopback address.`)
	db := fs.String("db", "", "store `URL`: sqlite://PATH or postgres://USER:PASSWORD@HOST/DB (default sqlite://DATA_DIR/mercator.db)")
	listen := fs.String("listen", "127.0.0.1:7070", "`address` to serve on")
	dataDir := fs.String("data-dir", "/var/lib/mercator/server", "`directory` for the admin credential, the CA and its keys, and the default database")
	public := fs.String("public-url", "", "`URL` agents and clients use to reach this server (default https://LISTEN); its host is in the server's certificate")
	replicaURL := fs.String("replica-url", "", "`URL` agents use to reach this replica itself, for the function calls it relays, when several replicas share --public-url (default --public-url)")
	lease := fs.Duration("lease", 30*time.Second, "how long a node stays ready without reporting")
	sessionTTL := fs.Duration("session-ttl", 24*time.Hour, "life of a node's session credential; agents renew it after two thirds")
	insecure := fs.String("insecure-registries", "", "comma-separated `hosts` reached over plain HTTP when pinning images (loopback always is)")
	contentStore := fs.String("content", "local", "Artifact content store: local (under DATA_DIR, signed URLs) or `s3://BUCKET/PREFIX?endpoint=HOST:PORT` (credential from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
	registryKeyFile := fs.String("registry-key-file", "", "`file` holding the 32-byte key (hex) that seals registry credentials and secret configuration (default: $MERCATOR_REGISTRY_KEY, else DATA_DIR/registry-key, generated on first start)")
	tlsCert := fs.String("tls-cert", "", "`file` of the server's certificate chain (PEM), instead of one from the server's own CA; re-read when it changes")
	tlsKey := fs.String("tls-key", "", "`file` of the private key of --tls-cert")
	tlsCACert := fs.String("tls-ca-cert", "", "`file` of a CA certificate: with --tls-ca-key, the CA the server issues its certificate from (the same for every replica); with --tls-cert, the CA clients pin")
	tlsCAKey := fs.String("tls-ca-key", "", "`file` of the private key of --tls-ca-cert")
	insecureHTTP := fs.Bool("insecure-http", false, "serve plain HTTP instead of HTTPS; refused unless --listen is a loopback address")
	level := fs.String("log-level", "info", "log `level`: debug, info, warn, error")
	metricsPublic := fs.Bool("metrics-public", false, "serve /metrics without a credential (default: a reader's is needed)")
	retention := daemon.RetentionFlags(fs.FlagSet, parseSpan)
	if pos, err := fs.parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	log, err := inv.logger(*level)
	if err != nil {
		return err
	}
	var regs []string
	if *insecure != "" {
		regs = strings.Split(*insecure, ",")
	}
	registryKey := inv.env("MERCATOR_REGISTRY_KEY")
	if *registryKeyFile != "" {
		if registryKey, err = nodeagent.ReadTokenFile(*registryKeyFile); err != nil {
			return fmt.Errorf("--registry-key-file: %w", err)
		}
	}
	return daemon.RunServer(ctx, daemon.ServerOptions{
		DB: *db, Listen: *listen, DataDir: *dataDir, PublicURL: *public, InsecureRegistries: regs,
		Content: *contentStore, RegistryKey: registryKey, InsecureHTTP: *insecureHTTP,
		TLS: daemon.TLSOptions{CertFile: *tlsCert, KeyFile: *tlsKey, CACertFile: *tlsCACert, CAKeyFile: *tlsCAKey},
		Config: controlplane.Config{Lease: *lease, SessionTTL: *sessionTTL, ReplicaURL: *replicaURL,
			MetricsPublic: *metricsPublic, Retention: *retention}, Logger: log,
		Ready: func(url, tokenFile string) {
			if tokenFile == "" {
				tokenFile = "(removed with `mercator token rm`; use another admin credential)"
			}
			termtext.Fprintf(inv.stderr, "control plane at %s\nadmin credential in %s\n", url, tokenFile)
			if strings.HasPrefix(url, "https://") {
				printCA(inv, daemon.CAFile(*dataDir))
			}
		},
	})
}

func runAgent(ctx context.Context, inv *invocation, args []string) error {
	fs := inv.flags("[flags]", `Run the node agent: it connects to the control plane (outbound only) and runs
the work placed on this machine through the local Docker daemon.

The first start needs a single-use invitation (--token-file) from
`+"`mercator node invite NODE_ID`"+`; later starts resume the session kept in --state.

The invitation carries the SHA-256 fingerprint of the control plane's CA:
the agent fetches the server's chain, pins the CA with that fingerprint
(kept in --state, so restarts trust it too) and refuses, before sending any
credential, a server whose chain does not lead to it. --ca-file replaces
the pin for an operator's own PKI. Plain http:// is refused unless the
control plane is on loopback.`)
	cp := fs.String("control-plane", "", "control plane `URL` (https://HOST:PORT)")
	caFile := fs.String("ca-file", "", "`file` of the CA certificate(s) the control plane's chain must lead to (default: the CA the invitation pins)")
	nodeID := fs.String("node-id", "", "this machine's node `ID`, as invited")
	stateDir := fs.String("state", "/var/lib/mercator/agent", "`directory` for the agent's durable state")
	tokenFile := fs.String("token-file", "", "`file` holding the invitation (mode 0600); needed for the first enrollment")
	dockerHost := fs.String("docker-host", "", "Docker daemon `address` (default $DOCKER_HOST or the local socket)")
	artifactRoot := fs.String("artifact-root", "", "`directory` for artifact copies (default STATE/artifacts)")
	var budget bytesize.Value
	fs.Var(&budget, "artifact-budget", "most `size` Artifact copies may take under the root, e.g. 500GiB; least recently used copies no work uses are evicted (default: the disk's free space)")
	accelTool := fs.String("accelerator-tool", "", "`path` of the GPU vendor tool (default nvidia-smi on PATH)")
	kernel := fs.String("kernel-reports", "", "`root` of the kernel's reports (default /proc)")
	heartbeat := fs.Duration("heartbeat", 0, "how often to report liveness and facts (default 5s, and at most a third of the lease)")
	functions := agentFunctionFlags(fs) // fn.go
	containment := agentContainmentFlags(fs)
	level := fs.String("log-level", "info", "log `level`: debug, info, warn, error")
	if pos, err := fs.parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	if *cp == "" || *nodeID == "" {
		return usagef("--control-plane and --node-id are required")
	}
	log, err := inv.logger(*level)
	if err != nil {
		return err
	}
	var invitation string
	if *tokenFile != "" {
		if invitation, err = nodeagent.ReadTokenFile(*tokenFile); err != nil {
			return err
		}
	}
	if *artifactRoot == "" {
		*artifactRoot = filepath.Join(*stateDir, "artifacts")
	}
	fnOpts, err := functions()
	if err != nil {
		return err
	}
	return daemon.RunAgent(ctx, daemon.AgentOptions{
		Functions: fnOpts, Containment: containment,
		ControlPlaneURL: *cp, NodeID: *nodeID, StateDir: *stateDir, Invitation: invitation, CAFile: *caFile, DockerHost: *dockerHost,
		ArtifactRoot: *artifactRoot, ArtifactBudget: int64(budget), AcceleratorTool: *accelTool, KernelReports: *kernel, Heartbeat: *heartbeat, Logger: log,
	})
}

// agentContainmentFlags declares the flags of what every workload container
// is held to (dockerengine.Containment; docs/hardening.md, "Contained
// workloads"), defaulting to dockerengine.DefaultContainment. The agent
// checks the result before it starts (daemon.RunAgent).
func agentContainmentFlags(fs *flagSet) *dockerengine.Containment {
	c := dockerengine.DefaultContainment()
	fs.Float64Var(&c.DefaultCPU, "default-cpu", c.DefaultCPU, "CPU `cores` of a Run or function that states none (0: no quota)")
	fs.Var((*bytesize.Value)(&c.DefaultMemoryBytes), "default-memory", "memory `size` limit of a Run that states none (0: no limit)")
	fs.Int64Var(&c.PidsLimit, "default-pids", c.PidsLimit, "most `processes` a workload container may have unless its Run asks for more")
	fs.Int64Var(&c.MaxPidsLimit, "max-pids", c.MaxPidsLimit, "most `processes` a Run may ask for (--pids-limit)")
	fs.Var((*bytesize.Value)(&c.LogMaxBytes), "workload-log-size", "most `size` of a Run container's output kept on this node's disk")
	return &c
}

func runDev(ctx context.Context, inv *invocation, args []string) error {
	fs := inv.flags("[flags]", `Run Mercator on this machine with embedded defaults: a control plane on
SQLite, one local agent driving the local Docker daemon, and an OCI registry
on loopback that keeps what is pushed to it across restarts.

It serves HTTPS with its own CA and writes the server's address, admin
credential and CA to the CLI's context "dev" (and makes it current), so
other terminals need no flags. Stop it with Ctrl-C.`)
	dataDir := fs.String("data-dir", devenv.DefaultDataDir(inv.env), "`directory` for the database, registry storage and agent state")
	listen := fs.String("listen", "127.0.0.1:7070", "control plane `address`")
	registry := fs.String("registry", "127.0.0.1:5000", "registry `address` on loopback, or off")
	nodeID := fs.String("node-id", "local", "the local node's `ID`")
	level := fs.String("log-level", "warn", "log `level`: debug, info, warn, error")
	if pos, err := fs.parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	log, err := inv.logger(*level)
	if err != nil {
		return err
	}
	return devenv.Run(ctx, devenv.Options{
		DataDir: *dataDir, Listen: *listen, Registry: *registry, NodeID: *nodeID,
		ContextPath: client.ContextPath(inv.env), Logger: log, Out: inv.stderr,
	})
}
