// Package fncmd is the command line of Mercator's Fn-compatible functions:
// `mercator app …` (applications, their configuration and secrets) and
// `mercator fn …` (deploy, invoke, list, get, delete, durable calls and
// their output), through the Fn-compatible API of package client.
//
// It owns these commands' flags, validation and output; the plumbing is
// package cli/command, and package cli's command table adds them by
// calling Register.
package fncmd

import "github.com/mercator/mercator/cli/command"

// Register adds the `app` and `fn` command groups through registerSub,
// package cli's function that adds a command under a group.
func Register(registerSub func(group, groupSummary string, c *command.Command)) {
	registerApp(registerSub)
	registerFn(registerSub)
}
