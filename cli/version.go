package cli

import (
	"context"
	"runtime"
	"runtime/debug"

	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/internal/termtext"
	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/nodeproto"
)

// Version is this build's version. Release builds set it with
// -ldflags "-X github.com/mercator/mercator/cli.Version=v1.2.3"; when it is
// empty, `mercator version` falls back to the module version and VCS
// revision Go recorded in the binary.
var Version = ""

func init() {
	register(&command.Command{Name: "version", Summary: "Print the version of this binary", Run: runVersion})
}

// versionInfo is what `mercator version -o json` prints.
type versionInfo struct {
	Version string `json:"version"`
	// AgentVersion is the version this binary's agent reports: what an
	// agent release is pushed as, and what the upgrade's probe asks of a
	// staged binary (package agentupgrade).
	AgentVersion      string `json:"agent_version"`
	CapabilityVersion int    `json:"capability_version"`
	Go                string `json:"go"`
	Platform          string `json:"platform"`
}

// buildVersion is Version, or what the Go toolchain recorded.
func buildVersion() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev != "" && v == "devel" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		v += "+" + rev + dirty
	}
	return v
}

func runVersion(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags]", `
Print the version of this binary, the node-protocol capability version it
speaks, and the Go toolchain and platform it was built for. It does not
contact the control plane.`)
	output := fs.String("output", "table", "output `format`: table or json")
	fs.AliasShort("o", "output")
	pos, err := fs.Parse(args)
	if err != nil {
		return err
	}
	if err := command.CheckOutput(*output); err != nil {
		return err
	}
	if len(pos) > 0 {
		return command.Usagef("unexpected argument %q", pos[0])
	}
	vi := versionInfo{Version: buildVersion(), AgentVersion: nodeagent.Version, CapabilityVersion: nodeproto.Version,
		Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if *output == "json" {
		return inv.WriteJSON(vi)
	}
	_, err = termtext.Fprintf(inv.Stdout, "mercator %s (capability %d, %s, %s)\n", vi.Version, vi.CapabilityVersion, vi.Go, vi.Platform)
	return err
}
