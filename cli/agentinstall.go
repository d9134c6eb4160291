package cli

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/mercator/mercator/internal/termtext"
	"github.com/mercator/mercator/nodeagent"
)

// `mercator agent install`: a fresh machine made a node in one line. It
// writes the binary, the invitation, the state directory and a systemd unit
// under --root (default /), and starts nothing: the operator runs the
// systemctl line it prints.

// Where install puts things, relative to --root.
const (
	installUnit       = "etc/systemd/system/mercator-agent.service"
	installBinary     = "usr/local/bin/mercator"
	installState      = "var/lib/mercator/agent"
	installInvitation = "etc/mercator/agent-invitation"
)

var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func agentInstall(ctx context.Context, inv *invocation, args []string) error {
	fs := inv.flags("--control-plane URL --node-id N --token-file F [flags]", `
Install the agent on this machine as a systemd service: the running binary
copied to /usr/local/bin/mercator (mode 0755; the agent replaces it on an
upgrade, keeping the previous one as mercator.prev), the invitation to
/etc/mercator/agent-invitation (0600), the state directory
/var/lib/mercator/agent (0700) and the unit
/etc/systemd/system/mercator-agent.service (0644), restarted always: an
upgraded agent that keeps crashing is rolled back on its fourth start
(docs/upgrades.md). Nothing is started; it prints the systemctl line to run.
--root writes under another directory (an image being built, a test).`)
	cp := fs.String("control-plane", "", "control plane `URL` (https://HOST:PORT)")
	nodeID := fs.String("node-id", "", "this machine's node `ID`, as invited")
	tokenFile := fs.String("token-file", "", "`file` holding the invitation from `mercator node invite`")
	root := fs.String("root", "/", "`directory` to install under")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	u, err := url.Parse(*cp)
	switch {
	case *cp == "" || *nodeID == "" || *tokenFile == "":
		return usagef("--control-plane, --node-id and --token-file are required")
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
		return usagef("--control-plane %q is not an http(s) URL", *cp)
	case !nodeIDPattern.MatchString(*nodeID):
		return usagef("--node-id %q: want 1 to 128 letters, digits, '.', '_' or '-'", *nodeID)
	}
	token, err := nodeagent.ReadTokenFile(*tokenFile)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	at := func(rel string) string { return filepath.Join(*root, rel) }
	steps := []struct {
		what string
		do   func() error
	}{
		{"state directory", func() error { return mkdirMode(at(installState), 0o700) }},
		{"invitation", func() error { return writeMode(at(installInvitation), []byte(token+"\n"), 0o600, 0o700) }},
		{"binary", func() error { return copyBinary(self, at(installBinary)) }},
		{"unit", func() error {
			return writeMode(at(installUnit), []byte(systemdUnit(*cp, *nodeID)), 0o644, 0o755)
		}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("install the %s: %w", s.what, err)
		}
	}
	_, err = termtext.Fprintf(inv.stdout, "installed the agent for node %s under %s\nstart it with:\n\n  systemctl daemon-reload && systemctl enable --now mercator-agent\n", *nodeID, *root)
	return err
}

// systemdUnit is the agent's unit. Restart=always is half of the rollback
// (docs/upgrades.md): a new binary that crashes before it confirms is
// started again, and rolled back by itself on its fourth start.
func systemdUnit(controlPlane, nodeID string) string {
	return strings.Join([]string{
		"[Unit]",
		"Description=Mercator node agent",
		"Documentation=https://github.com/mercator/mercator/blob/main/docs/upgrades.md",
		"After=network-online.target docker.service",
		"Wants=network-online.target",
		"",
		"[Service]",
		"Type=simple",
		"ExecStart=/" + installBinary + " agent --control-plane " + controlPlane + " --node-id " + nodeID +
			" --state /" + installState + " --token-file /" + installInvitation,
		"Restart=always",
		"RestartSec=2s",
		"",
		"[Install]",
		"WantedBy=multi-user.target",
		"",
	}, "\n")
}

func mkdirMode(dir string, mode os.FileMode) error {
	if err := os.MkdirAll(dir, mode); err != nil {
		return err
	}
	return os.Chmod(dir, mode) // MkdirAll is subject to the umask, and keeps an existing mode
}

// writeMode writes path with mode, its directory created with dirMode.
func writeMode(path string, b []byte, mode, dirMode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", b, mode); err != nil {
		return err
	}
	if err := os.Chmod(path+".tmp", mode); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// copyBinary copies the running binary to dst (0755), unless it is dst.
func copyBinary(src, dst string) error {
	if same, err := filepath.EvalSymlinks(src); err == nil {
		if d, err := filepath.EvalSymlinks(dst); err == nil && d == same {
			return nil
		}
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Chmod(dst+".tmp", 0o755); err != nil {
		return err
	}
	return os.Rename(dst+".tmp", dst)
}
