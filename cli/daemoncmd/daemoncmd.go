// Package daemoncmd is the command line of Mercator's long-running and
// measuring processes: `mercator server`, `mercator agent` (with `agent
// install` and `agent recover`), `mercator dev` and `mercator bench …`.
//
// Each command is flags and wiring only; the work is in package daemon,
// nodeagent, agentupgrade, devenv and fleetsim, which end-to-end tests call
// directly. The plumbing is package cli/command, and package cli's command
// table adds these commands by calling Register.
package daemoncmd

import "github.com/mercator/mercator/cli/command"

// Register adds the commands through register (a top-level command) and
// registerSub (a command under a group), package cli's registry functions.
func Register(register func(c *command.Command), registerSub func(group, groupSummary string, c *command.Command)) {
	registerDaemons(register)
	registerBench(registerSub)
}
