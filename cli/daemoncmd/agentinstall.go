package daemoncmd

import (
	"context"
	"net/url"
	"os"
	"regexp"

	"github.com/mercator/mercator/agentupgrade"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/internal/termtext"
	"github.com/mercator/mercator/nodeagent"
)

// `mercator agent install`: a fresh machine made a node in one line
// (agentupgrade.Install writes the files, under --root, default /); it
// starts nothing: the operator runs the systemctl line it prints.

var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// agentRecover is `mercator agent recover --state DIR`, the unit's
// ExecStopPost (agentupgrade.Recover); systemd states how the agent ended
// in $SERVICE_RESULT.
func agentRecover(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("--state DIR", `
Run by the agent's systemd unit after the agent ended: when it ended in
failure while an upgrade was on trial, count it, and past three put the
previous binary back (docs/upgrades.md, "Rollback").`)
	state := fs.String("state", "/"+agentupgrade.InstallState, "the agent's state `directory`")
	if _, err := fs.Parse(args); err != nil {
		return err
	}
	restored, err := agentupgrade.Recover(*state, inv.Env("SERVICE_RESULT") != "success")
	if restored {
		termtext.Fprintf(inv.Stderr, "restored the previous agent binary: the upgrade on trial kept failing\n")
	}
	return err
}

func agentInstall(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("--control-plane URL --node-id N --token-file F [flags]", `
Install the agent on this machine as a systemd service: the running binary
copied to /usr/local/bin/mercator (mode 0755; the agent replaces it on an
upgrade, keeping the previous one as mercator.prev), the invitation to
/etc/mercator/agent-invitation (0600), the state directory
/var/lib/mercator/agent (0700) and the unit
/etc/systemd/system/mercator-agent.service (0644), restarted always, and
after a failed end the previous binary's `+"`agent recover`"+` counts it: an
upgraded agent that keeps failing is rolled back (docs/upgrades.md). Nothing is started; it prints the systemctl line to run.
--root writes under another directory (an image being built, a test).`)
	cp := fs.String("control-plane", "", "control plane `URL` (https://HOST:PORT)")
	nodeID := fs.String("node-id", "", "this machine's node `ID`, as invited")
	tokenFile := fs.String("token-file", "", "`file` holding the invitation from `mercator node invite`")
	root := fs.String("root", "/", "`directory` to install under")
	pos, err := fs.Parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return command.Usagef("unexpected argument %q", pos[0])
	}
	u, err := url.Parse(*cp)
	switch {
	case *cp == "" || *nodeID == "" || *tokenFile == "":
		return command.Usagef("--control-plane, --node-id and --token-file are required")
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
		return command.Usagef("--control-plane %q is not an http(s) URL", *cp)
	case !nodeIDPattern.MatchString(*nodeID):
		return command.Usagef("--node-id %q: want 1 to 128 letters, digits, '.', '_' or '-'", *nodeID)
	}
	token, err := nodeagent.ReadTokenFile(*tokenFile)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := (agentupgrade.Install{Root: *root, ControlPlane: *cp, NodeID: *nodeID, Invitation: token, Binary: self}).Write(); err != nil {
		return err
	}
	_, err = termtext.Fprintf(inv.Stdout, "installed the agent for node %s under %s\nstart it with:\n\n  systemctl daemon-reload && systemctl enable --now mercator-agent\n", *nodeID, *root)
	return err
}
