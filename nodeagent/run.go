package nodeagent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Version is the agent's version string, reported in its facts.
var Version = "0.1.0-dev"

// Options is what `mercator agent` is started with.
type Options struct {
	ControlPlaneURL string
	NodeID          string
	// StateDir holds the agent's state file (credential, applied
	// operations, spool).
	StateDir string
	// Invitation is the single-use token; needed only for the first
	// enrollment (or after a credential was lost).
	Invitation string
	// DockerHost is the daemon to drive ("" = DOCKER_HOST or the local socket).
	DockerHost string
	// ArtifactRoot is where Artifact copies are kept (default
	// STATE_DIR/artifacts), and ArtifactBudget the most bytes they may
	// take there (0: the disk's free space is the only bound).
	ArtifactRoot    string
	ArtifactBudget  int64
	AcceleratorTool string
	KernelReports   string
	Heartbeat       time.Duration
	Logger          *slog.Logger
	// Functions configures the hot-container engine (functions.go).
	Functions FunctionsOptions
}

// ReadTokenFile reads an invitation from a file, refusing one readable by
// others: an invitation is a credential.
func ReadTokenFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("token file %s is readable by others (mode %o); run `chmod 600 %s`", path, fi.Mode().Perm(), path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// Run wires the Docker runtime, the state file and the HTTP transport into
// an Agent and runs it until ctx ends or the agent cannot continue.
func Run(ctx context.Context, o Options) error {
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
	ropts := []RuntimeOption{WithNodeLabel(o.NodeID)}
	if o.ArtifactRoot == "" {
		o.ArtifactRoot = filepath.Join(o.StateDir, "artifacts")
	}
	ropts = append(ropts, WithArtifactRoot(o.ArtifactRoot),
		WithArtifactOptions(ArtifactOptions{Budget: o.ArtifactBudget, Logger: o.Logger.With("component", "artifacts")}))
	if o.AcceleratorTool != "" {
		ropts = append(ropts, WithAcceleratorTool(o.AcceleratorTool))
	}
	if o.KernelReports != "" {
		ropts = append(ropts, WithKernelReports(o.KernelReports))
	}
	rt, err := NewDockerRuntime(o.DockerHost, ropts...)
	if err != nil {
		return fmt.Errorf("docker runtime: %w", err)
	}
	if err := rt.WaitReady(ctx, func(err error) {
		o.Logger.Warn("waiting for the Docker daemon", "err", err)
	}); err != nil {
		return err
	}
	state, err := OpenState(o.StateDir)
	if err != nil {
		return err
	}
	defer state.Close()
	aopts := []Option{WithLogger(o.Logger)}
	if o.Heartbeat > 0 {
		aopts = append(aopts, WithHeartbeat(o.Heartbeat))
	}
	fnOpts, stopFunctions, err := startFunctions(ctx, o, rt)
	if err != nil {
		return err
	}
	defer stopFunctions()
	aopts = append(aopts, fnOpts...)
	agent := New(Identity{ControlPlaneURL: o.ControlPlaneURL, NodeID: o.NodeID, EnrollmentToken: o.Invitation, AgentVersion: Version},
		rt, NewHTTPTransport(o.ControlPlaneURL, nil), state, aopts...)
	return agent.Run(ctx)
}
