package agentupgrade

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Where install puts things, relative to Install.Root.
const (
	InstallUnit       = "etc/systemd/system/mercator-agent.service"
	InstallBinary     = "usr/local/bin/mercator"
	InstallState      = "var/lib/mercator/agent"
	InstallInvitation = "etc/mercator/agent-invitation"
)

// Install is an agent installed as a systemd service on a fresh machine
// (`mercator agent install`).
type Install struct {
	// Root is the directory everything is written under ("/" on the
	// machine itself).
	Root         string
	ControlPlane string
	NodeID       string
	Invitation   string
	// Binary is the mercator binary to copy to InstallBinary.
	Binary string
}

// Write writes the state directory (0700), the invitation (0600), the
// binary (0755; the agent replaces it on upgrades) and the unit (0644).
func (i Install) Write() error {
	at := func(rel string) string { return filepath.Join(i.Root, rel) }
	steps := []struct {
		what string
		do   func() error
	}{
		{"state directory", func() error { return mkdirMode(at(InstallState), 0o700) }},
		{"invitation", func() error { return writeMode(at(InstallInvitation), []byte(i.Invitation+"\n"), 0o600, 0o700) }},
		{"binary", func() error { return copyBinary(i.Binary, at(InstallBinary)) }},
		{"unit", func() error { return writeMode(at(InstallUnit), []byte(Unit(i.ControlPlane, i.NodeID)), 0o644, 0o755) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("install the %s: %w", s.what, err)
		}
	}
	return nil
}

// Unit is the agent's systemd unit: restarted always, and after a failed
// end the previous binary's `agent recover` (Recover) counts it against
// an upgrade on trial. Restart=always is half of the rollback
// (docs/upgrades.md): a new binary that crashes before it confirms is
// started again, and rolled back by itself on its fourth start.
func Unit(controlPlane, nodeID string) string {
	return strings.Join([]string{
		"[Unit]",
		"Description=Mercator node agent",
		"Documentation=https://github.com/mercator/mercator/blob/main/docs/upgrades.md",
		"After=network-online.target docker.service",
		"Wants=network-online.target",
		"",
		"[Service]",
		"Type=simple",
		"ExecStart=/" + InstallBinary + " agent --control-plane " + controlPlane + " --node-id " + nodeID +
			" --state /" + InstallState + " --token-file /" + InstallInvitation,
		"Restart=always",
		"RestartSec=2s",
		// After a failed end, the previous binary (when an upgrade kept
		// one) counts it against the new binary's trial (Recover).
		"ExecStopPost=-/bin/sh -c 'test -x /" + InstallBinary + ".prev && exec /" + InstallBinary + ".prev agent recover --state /" + InstallState + "'",
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
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := copyFile(src, dst+".tmp"); err != nil {
		return err
	}
	if err := os.Chmod(dst+".tmp", 0o755); err != nil {
		return err
	}
	return os.Rename(dst+".tmp", dst)
}
