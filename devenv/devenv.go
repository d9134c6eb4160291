// Package devenv is `mercator dev`: a control plane on SQLite, one local
// agent, and an OCI registry on loopback, in one process with embedded
// defaults, for a laptop or a single box. The control plane serves HTTPS with
// its own CA, like `mercator server`; dev leaves the server's address, admin
// credential and CA where the CLI looks by default, so a second terminal
// needs no flags.
//
// Package cli imports it; so may end-to-end tests.
package devenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/devregistry"
	"github.com/mercator/mercator/nodeagent"
)

// Options configures the dev environment. Zero values take the defaults
// noted on each field.
type Options struct {
	// DataDir holds the database, the registry's storage, the agent's state
	// and the admin credential (default ~/.local/share/mercator/dev).
	DataDir string
	// Listen is the control plane's address (default 127.0.0.1:7070).
	Listen string
	// Registry is the OCI registry's address (default 127.0.0.1:5000);
	// "off" runs none.
	Registry string
	// NodeID is the local agent's node (default "local").
	NodeID string
	// ContextPath is where the CLI's context file is; dev saves its
	// context "dev" there (address, admin credential, CA) and makes it the
	// current one.
	ContextPath string
	Logger      *slog.Logger
	// Out receives the human summary of where everything is.
	Out io.Writer
	// Ready is called once everything is up, with the server URL and the
	// registry address.
	Ready func(url, registry string)
}

// DefaultDataDir is where dev keeps its state when no directory is given.
func DefaultDataDir(env func(string) string) string {
	if d := env("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "mercator", "dev")
	}
	if h := env("HOME"); h != "" {
		return filepath.Join(h, ".local", "share", "mercator", "dev")
	}
	return filepath.Join(os.TempDir(), "mercator-dev")
}

// setDefaults fills the options left empty.
func (o *Options) setDefaults() {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:7070"
	}
	if o.Registry == "" {
		o.Registry = "127.0.0.1:5000"
	}
	if o.NodeID == "" {
		o.NodeID = "local"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
}

// Run starts the registry, the control plane and the local agent and runs
// until ctx ends or one of them fails.
func Run(ctx context.Context, o Options) error {
	if o.DataDir == "" {
		return errors.New("devenv: DataDir is required")
	}
	o.setDefaults()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	registryAddr := ""
	if o.Registry != "off" {
		reg, err := devregistry.Start(ctx, o.Registry, filepath.Join(o.DataDir, "registry"), o.Logger.With("component", "registry"))
		if err != nil {
			return fmt.Errorf("start the registry on %s (use --registry ADDR to pick another address): %w", o.Registry, err)
		}
		defer reg.Close(context.Background())
		registryAddr = reg.Addr()
	}

	serverDir := filepath.Join(o.DataDir, "server")
	ready := make(chan [2]string, 1)
	errc := make(chan error, 1)
	// On the way out the control plane is stopped and waited for: it
	// waits for its agent, which removes its function containers and its
	// network namespace holders as it closes, and a process that returned
	// at once would cut that short, leaving them running.
	running := 1
	defer func() {
		cancel()
		waitStopped(errc, running, stopWait)
	}()
	go func() {
		errc <- daemon.RunServer(ctx, daemon.ServerOptions{
			DataDir: serverDir, Listen: o.Listen, Logger: o.Logger.With("component", "server"),
			Ready: func(url, tokenFile string) { ready <- [2]string{url, tokenFile} },
			// The local agent in the server's process (--local-agent),
			// enrolled by the server itself.
			LocalAgent: &daemon.AgentOptions{
				NodeID: o.NodeID, StateDir: filepath.Join(o.DataDir, "agent"), ArtifactRoot: filepath.Join(o.DataDir, "artifacts"),
				Logger: o.Logger.With("component", "agent"), Functions: nodeagent.FunctionsOptions{OutputRelay: daemon.OutputRelayAuto},
			},
		})
	}()
	var url, tokenFile string
	select {
	case r := <-ready:
		url, tokenFile = r[0], r[1]
	case err := <-errc:
		running--
		return fmt.Errorf("control plane: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	caFile := daemon.CAFile(serverDir)
	if o.ContextPath != "" {
		if err := client.SaveContext(o.ContextPath, "dev", client.Context{Addr: url, TokenFile: tokenFile, CAFile: caFile}, true); err != nil {
			return fmt.Errorf("write the CLI context file: %w", err)
		}
	}
	fmt.Fprintf(o.Out, "mercator dev is up\n  control plane  %s\n  admin token    %s\n  CA             %s\n  registry       %s\n  node           %s (local Docker)\n  data           %s\n",
		url, tokenFile, caFile, orNone(registryAddr), o.NodeID, o.DataDir)
	if o.ContextPath != "" {
		fmt.Fprintf(o.Out, "  CLI context    %s (other terminals need no flags)\n", o.ContextPath)
	}
	if o.Ready != nil {
		o.Ready(url, registryAddr)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		running--
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
}

// stopWait bounds how long Run waits for the control plane and the agent
// to stop: past the agent's 30 s for closing its function engine.
const stopWait = 45 * time.Second

// waitStopped waits for n results on errc, for at most limit.
func waitStopped(errc <-chan error, n int, limit time.Duration) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for ; n > 0; n-- {
		select {
		case <-errc:
		case <-timer.C:
			return
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
