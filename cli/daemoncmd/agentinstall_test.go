package daemoncmd_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mercator/mercator/cli/internal/clirun"

	"github.com/mercator/mercator/agentupgrade"
)

// TestAgentInstallWritesUnitAndModes: `agent install --root` writes the
// binary, the invitation, the state directory and the unit, each with its
// mode, and the unit runs the agent with the given control plane and node.
func TestAgentInstallWritesUnitAndModes(t *testing.T) {
	root := t.TempDir()
	tok := filepath.Join(t.TempDir(), "inv")
	if err := os.WriteFile(tok, []byte("mci_secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "agent", "install", "--control-plane", "https://cp.example:7070", "--node-id", "gpu-7", "--token-file", tok, "--root", root)
	if r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.Stderr)
	}
	for rel, mode := range map[string]os.FileMode{agentupgrade.InstallState: 0o700 | os.ModeDir, agentupgrade.InstallInvitation: 0o600, agentupgrade.InstallBinary: 0o755, agentupgrade.InstallUnit: 0o644} {
		st, err := os.Stat(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != mode {
			t.Errorf("%s: mode %s, want %s", rel, st.Mode(), mode)
		}
	}
	unit, _ := os.ReadFile(filepath.Join(root, agentupgrade.InstallUnit))
	for _, want := range []string{"ExecStart=/usr/local/bin/mercator agent --control-plane https://cp.example:7070 --node-id gpu-7 --state /var/lib/mercator/agent --token-file /etc/mercator/agent-invitation", "Restart=always", "ExecStopPost=-/bin/sh -c 'test -x /usr/local/bin/mercator.prev && exec /usr/local/bin/mercator.prev agent recover --state /var/lib/mercator/agent'"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("unit lacks %q:\n%s", want, unit)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, agentupgrade.InstallInvitation)); strings.TrimSpace(string(b)) != "mci_secret" {
		t.Errorf("invitation %q", b)
	}
	if !strings.Contains(r.Stdout, "systemctl daemon-reload && systemctl enable --now mercator-agent") {
		t.Errorf("stdout: %s", r.Stdout)
	}
	// Bad input is refused with what was wrong.
	if r := runCLI(t, nil, "agent", "install", "--control-plane", "ftp://x", "--node-id", "n", "--token-file", tok, "--root", root); r.Code != 2 || !strings.Contains(r.Stderr, "not an http(s) URL") {
		t.Errorf("ftp URL: exit %d %s", r.Code, r.Stderr)
	}
}

// runCLI runs the whole command line (package clirun).
func runCLI(t *testing.T, env map[string]string, args ...string) clirun.Result {
	return clirun.Run(t, env, args...)
}
