// Package relaymain makes the binary that imports it the function output
// relay (package outputrelay) when started with outputrelay.Arg: its init
// runs the relay and exits. The agent (package daemon) imports it, so every
// binary with the agent in it, the mercator binary first, can be its own
// node's relay.
//
// It is an init, not a branch in main, because a relay starts each
// function container: with nothing but the standard library beneath it, it
// is initialized before most of the binary's packages (Go initializes,
// among the packages ready, the first by import path), so the relay does
// not wait for theirs: measured, the relay's whole run before it executes
// the function's command takes about 4 ms as an init against 11 ms as a
// branch in main (docs/performance.md).
package relaymain

import (
	"os"

	"github.com/mercator/mercator/fnagent/outputrelay"
)

func init() {
	if len(os.Args) > 1 && os.Args[1] == outputrelay.Arg {
		os.Exit(outputrelay.Relay(os.Args[2:]))
	}
}
