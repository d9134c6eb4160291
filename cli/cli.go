// Package cli is the command line of the one `mercator` binary: Main, the
// command table, and the client commands (`run …`, `node …`, `version`)
// that talk to the control plane's public HTTP API through package client.
// The table also holds the commands of cli/fncmd (`app …`, `fn …`) and
// cli/daemoncmd (`server`, `agent`, `dev`, `bench …`), which add themselves
// through their Register functions, called from this package's init.
//
// cmd/mercator is a thin wrapper around Main; end-to-end tests call Main
// directly with their own arguments, streams and environment, so nothing here
// reads os.Args, os.Stdout or os.Getenv on its own.
//
// # Adding a command
//
// Commands live in a registry, not in a switch, so each can sit in its own
// file. A file adds its commands from init:
//
//	func init() {
//		register(&command.Command{
//			Name:    "server",
//			Summary: "Run the control plane",
//			Run:     runServer,
//		})
//	}
//
//	func runServer(ctx context.Context, inv *command.Invocation, args []string) error {
//		fs := inv.Flags("[flags]", "Run the control plane ...")
//		listen := fs.String("listen", "127.0.0.1:7070", "`address` to listen on")
//		if _, err := fs.Parse(args); err != nil {
//			return err
//		}
//		...
//	}
//
// A subcommand of a group ("run submit") is added with registerSub. A
// package of commands (cli/fncmd, cli/daemoncmd) cannot see the registry;
// it exports a Register function that takes register and registerSub,
// called from this package's init. The plumbing a command uses (command.Invocation, command.FlagSet,
// the client flags, output helpers) is package cli/command. A Run function
// returns nil for exit status 0; an error from command.Usagef (or from
// Parse) for a usage error, exit status 2; command.ExitCode(n) to end with
// status n without a message; and any other error to print "error: …" and
// exit 1.
// Anything not registered is reported as an unknown command.
//
// # Conventions
//
// Client commands take --addr, --token-file, --ca-file and, where they print an object,
// -o/--output table|json. JSON output is the API object exactly as package
// api defines it, indented, so scripts can rely on its field names. Data goes
// to stdout and everything for a person (progress, summaries, errors) to
// stderr, so `id=$(mercator run submit …)` captures the ID alone.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/cli/daemoncmd"
	"github.com/mercator/mercator/cli/fncmd"
	"github.com/mercator/mercator/internal/termtext"
)

// Main runs the mercator command line with args (without the program name)
// and returns the process exit status: 0 on success, 1 on an error, 2 on a
// usage error, and whatever a command defines beyond that (`run wait` exits
// with the run's exit code). It reads the environment only through env, and
// stops long operations when ctx ends.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) int {
	inv := &command.Invocation{Stdin: stdin, Stdout: stdout, Stderr: stderr, Env: env, Now: time.Now}
	return execute(ctx, inv, args)
}

// commands is the registry of top-level commands, filled by init functions.
var commands = map[string]*command.Command{}

// register adds a top-level command; it panics on a duplicate name, which is
// a programming error found by any test.
func register(c *command.Command) {
	if _, dup := commands[c.Name]; dup {
		panic("cli: command " + c.Name + " registered twice")
	}
	commands[c.Name] = c
}

// registerSub adds c under the group called group, creating the group with
// groupSummary if it does not exist yet.
func registerSub(group, groupSummary string, c *command.Command) {
	g, ok := commands[group]
	if !ok {
		g = &command.Command{Name: group, Summary: groupSummary, Subs: map[string]*command.Command{}}
		register(g)
	}
	if g.Subs == nil {
		panic("cli: command " + group + " is not a group")
	}
	if _, dup := g.Subs[c.Name]; dup {
		panic("cli: command " + group + " " + c.Name + " registered twice")
	}
	g.Subs[c.Name] = c
}

// execute runs the command line of inv and returns its exit status (see
// Main), printing a failed command's error for a person.
func execute(ctx context.Context, inv *command.Invocation, args []string) int {
	err := dispatch(ctx, inv, args)
	var code command.ExitCode
	var ue *command.UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	case errors.As(err, &ue):
		termtext.Fprintf(inv.Stderr, "error: %s\n", termtext.Lines(ue.Error()))
		if inv.Path != "" {
			fmt.Fprintf(inv.Stderr, "Run 'mercator %s --help' for usage.\n", inv.Path)
		} else {
			fmt.Fprintln(inv.Stderr, "Run 'mercator help' for usage.")
		}
		return 2
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		fmt.Fprintln(inv.Stderr, "error: interrupted")
		return 130
	default:
		termtext.Fprintf(inv.Stderr, "error: %s\n", err) // the server's message may quote what a node or user sent
		return 1
	}
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// dispatch walks the command tree along args and runs the leaf it reaches.
func dispatch(ctx context.Context, inv *command.Invocation, args []string) error {
	if len(args) == 0 {
		printUsage(inv.Stderr, nil, "")
		return command.ExitCode(2)
	}
	if isHelp(args[0]) {
		if len(args) == 1 {
			printUsage(inv.Stdout, nil, "")
			return nil
		}
		// "help run submit" is "run submit --help".
		return dispatch(ctx, inv, append(append([]string{}, args[1:]...), "--help"))
	}
	cmd, ok := commands[args[0]]
	if !ok {
		return command.Usagef("unknown command %q", args[0])
	}
	inv.Path = cmd.Name
	args = args[1:]
	for cmd.Subs != nil {
		if len(args) == 0 {
			printUsage(inv.Stderr, cmd.Subs, inv.Path)
			return command.ExitCode(2)
		}
		if isHelp(args[0]) {
			printUsage(inv.Stdout, cmd.Subs, inv.Path)
			return nil
		}
		sub, ok := cmd.Subs[args[0]]
		if !ok {
			return command.Usagef("unknown command %q", inv.Path+" "+args[0])
		}
		cmd, inv.Path, args = sub, inv.Path+" "+sub.Name, args[1:]
	}
	return cmd.Run(ctx, inv, args)
}

// printUsage lists every leaf command under subs (the whole registry when
// subs is nil) with its one-line summary.
func printUsage(w io.Writer, subs map[string]*command.Command, prefix string) {
	if subs == nil {
		subs = commands
		fmt.Fprint(w, "Usage: mercator <command> [flags] [args]\n\n"+
			"Mercator runs containerized workloads on a fleet of machines.\n\n")
	} else {
		fmt.Fprintf(w, "Usage: mercator %s <command> [flags] [args]\n\n", prefix)
	}
	fmt.Fprintln(w, "Commands:")
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	var walk func(prefix string, m map[string]*command.Command)
	walk = func(prefix string, m map[string]*command.Command) {
		for _, name := range command.SortedKeys(m) {
			c := m[name]
			full := strings.TrimSpace(prefix + " " + c.Name)
			if c.Subs != nil {
				walk(full, c.Subs)
				continue
			}
			fmt.Fprintf(tw, "  %s\t%s\n", full, c.Summary)
		}
	}
	walk(prefix, subs)
	_ = tw.Flush()
	fmt.Fprintln(w, "\nRun 'mercator <command> --help' for a command's flags.")
}

// The command groups that live in packages of their own.
func init() {
	fncmd.Register(registerSub)
	daemoncmd.Register(register, registerSub)
}
