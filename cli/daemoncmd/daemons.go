package daemoncmd

import (
	"context"
	"log/slog"
	"strings"

	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/devenv"
	"github.com/mercator/mercator/internal/termtext"
)

// This file holds the long-running commands: server, agent and dev. Each is
// flags and wiring only; the work is in daemon.RunServer, nodeagent.Run and
// devenv.Run, which end-to-end tests call directly.

// registerDaemons adds `server`, `agent` and `dev` through register (see
// Register).
func registerDaemons(register func(c *command.Command)) {
	register(&command.Command{Name: "server", Summary: "Run the control plane", Run: runServer})
	register(&command.Command{Name: "agent", Summary: "Run the node agent on this machine (`agent install`: as a systemd service)", Run: runAgent})
	register(&command.Command{Name: "dev", Summary: "Run a control plane, a local agent and a registry on loopback, with embedded defaults", Run: runDev})
}

// logger is the daemons' log, to stderr, at the --log-level given.
func logger(inv *command.Invocation, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, command.Usagef("--log-level must be debug, info, warn or error, not %q", level)
	}
	return slog.New(slog.NewTextHandler(inv.Stderr, &slog.HandlerOptions{Level: l})), nil
}

func runServer(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags]", `Run the control plane: the public API, the node protocol and the scheduler.

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
on a loopback address.

--local-agent NODE_ID also runs the node agent for this machine in the
server's process, enrolled by the server itself (one process, as Fn's
fnserver is; docs/guide.md). Its flags are `+"`mercator agent`"+`'s, named
--agent-… (--agent-state, --agent-fn-memory, --agent-label, …).`)
	options := daemon.ServerFlags(fs.FlagSet, inv.Env, command.ParseSpan)
	level := fs.String("log-level", "info", "log `level`: debug, info, warn, error")
	if pos, err := fs.Parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return command.Usagef("unexpected argument %q", pos[0])
	}
	log, err := logger(inv, *level)
	if err != nil {
		return err
	}
	o, err := options()
	if err != nil {
		return err
	}
	o.Logger = log
	o.Ready = func(url, tokenFile string) {
		if tokenFile == "" {
			tokenFile = "(removed with `mercator token rm`; use another admin credential)"
		}
		termtext.Fprintf(inv.Stderr, "control plane at %s\nadmin credential in %s\n", url, tokenFile)
		if strings.HasPrefix(url, "https://") {
			command.PrintCA(inv, daemon.CAFile(o.DataDir))
		}
	}
	return daemon.RunServer(ctx, o)
}

func runAgent(ctx context.Context, inv *command.Invocation, args []string) error {
	if len(args) > 0 && (args[0] == "install" || args[0] == "recover") { // agentinstall.go
		inv.Path += " " + args[0]
		if args[0] == "recover" {
			return agentRecover(ctx, inv, args[1:])
		}
		return agentInstall(ctx, inv, args[1:])
	}
	fs := inv.Flags("[flags]", `Run the node agent: it connects to the control plane (outbound only) and runs
the work placed on this machine through the local Docker daemon.

The first start needs a single-use invitation (--token-file) from
`+"`mercator node invite NODE_ID`"+`; later starts resume the session kept in --state.

The invitation carries the SHA-256 fingerprint of the control plane's CA:
the agent fetches the server's chain, pins the CA with that fingerprint
(kept in --state, so restarts trust it too) and refuses, before sending any
credential, a server whose chain does not lead to it. --ca-file replaces
the pin for an operator's own PKI. Plain http:// is refused unless the
control plane is on loopback.`)
	options := daemon.AgentFlags(fs.FlagSet)
	level := fs.String("log-level", "info", "log `level`: debug, info, warn, error")
	if pos, err := fs.Parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return command.Usagef("unexpected argument %q", pos[0])
	}
	o, err := options()
	if err != nil {
		return command.Usagef("%v", err)
	}
	if o.Logger, err = logger(inv, *level); err != nil {
		return err
	}
	return daemon.RunAgent(ctx, o)
}

func runDev(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags]", `Run Mercator on this machine with embedded defaults: a control plane on
SQLite, one local agent driving the local Docker daemon, and an OCI registry
on loopback that keeps what is pushed to it across restarts.

It serves HTTPS with its own CA and writes the server's address, admin
credential and CA to the CLI's context "dev" (and makes it current), so
other terminals need no flags. Stop it with Ctrl-C.`)
	dataDir := fs.String("data-dir", devenv.DefaultDataDir(inv.Env), "`directory` for the database, registry storage and agent state")
	listen := fs.String("listen", "127.0.0.1:7070", "control plane `address`")
	registry := fs.String("registry", "127.0.0.1:5000", "registry `address` on loopback, or off")
	nodeID := fs.String("node-id", "local", "the local node's `ID`")
	level := fs.String("log-level", "warn", "log `level`: debug, info, warn, error")
	if pos, err := fs.Parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return command.Usagef("unexpected argument %q", pos[0])
	}
	log, err := logger(inv, *level)
	if err != nil {
		return err
	}
	return devenv.Run(ctx, devenv.Options{
		DataDir: *dataDir, Listen: *listen, Registry: *registry, NodeID: *nodeID,
		ContextPath: client.ContextPath(inv.Env), Logger: log, Out: inv.Stderr,
	})
}
