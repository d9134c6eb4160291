// Package cli is the command line of the one `mercator` binary: the client
// commands (`run …`, `node …`, `version`) that talk to the control plane's
// public HTTP API through package client, and the registry the server-side
// commands (`server`, `agent`, `dev`) join from their own files.
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
//		register(&command{
//			name:    "server",
//			summary: "Run the control plane",
//			run:     runServer,
//		})
//	}
//
//	func runServer(ctx context.Context, inv *invocation, args []string) error {
//		fs := inv.flags("[flags]", "Run the control plane ...")
//		listen := fs.String("listen", "127.0.0.1:7070", "`address` to listen on")
//		if _, err := fs.parse(args); err != nil {
//			return err
//		}
//		...
//	}
//
// A subcommand of a group ("run submit") is added with registerSub. A run
// function returns nil for exit status 0; an error from usagef (or from
// parse) for a usage error, exit status 2; exitCode(n) to end with status n
// without a message; and any other error to print "error: …" and exit 1.
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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/termtext"
)

// Main runs the mercator command line with args (without the program name)
// and returns the process exit status: 0 on success, 1 on an error, 2 on a
// usage error, and whatever a command defines beyond that (`run wait` exits
// with the run's exit code). It reads the environment only through env, and
// stops long operations when ctx ends.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) int {
	inv := &invocation{stdin: stdin, stdout: stdout, stderr: stderr, env: env, now: time.Now}
	return inv.main(ctx, args)
}

// command is one entry of the command tree: a leaf with run, or a group
// ("run", "node") with subcommands.
type command struct {
	// name is the word that selects the command.
	name string
	// summary is one line for command lists, starting with a capital letter
	// and without a final period.
	summary string
	// run executes a leaf with the arguments after its name. See the package
	// doc for what its error means.
	run func(ctx context.Context, inv *invocation, args []string) error
	// subs are a group's subcommands by name.
	subs map[string]*command
}

// commands is the registry of top-level commands, filled by init functions.
var commands = map[string]*command{}

// register adds a top-level command; it panics on a duplicate name, which is
// a programming error found by any test.
func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("cli: command " + c.name + " registered twice")
	}
	commands[c.name] = c
}

// registerSub adds c under the group called group, creating the group with
// groupSummary if it does not exist yet.
func registerSub(group, groupSummary string, c *command) {
	g, ok := commands[group]
	if !ok {
		g = &command{name: group, summary: groupSummary, subs: map[string]*command{}}
		register(g)
	}
	if g.subs == nil {
		panic("cli: command " + group + " is not a group")
	}
	if _, dup := g.subs[c.name]; dup {
		panic("cli: command " + group + " " + c.name + " registered twice")
	}
	g.subs[c.name] = c
}

// invocation is one execution of the command line: its streams, environment
// and clock, and the path of the command being run ("run submit"), which
// messages name.
type invocation struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	env            func(string) string
	now            func() time.Time
	path           string
}

// usageError is a mistake in the command line; it exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// usagef reports a usage error (exit status 2).
func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// exitCode ends the command with the given status and no message.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func (inv *invocation) main(ctx context.Context, args []string) int {
	err := inv.dispatch(ctx, args)
	var code exitCode
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	case errors.As(err, &ue):
		termtext.Fprintf(inv.stderr, "error: %s\n", termtext.Lines(ue.msg))
		if inv.path != "" {
			fmt.Fprintf(inv.stderr, "Run 'mercator %s --help' for usage.\n", inv.path)
		} else {
			fmt.Fprintln(inv.stderr, "Run 'mercator help' for usage.")
		}
		return 2
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		fmt.Fprintln(inv.stderr, "error: interrupted")
		return 130
	default:
		termtext.Fprintf(inv.stderr, "error: %s\n", err) // the server's message may quote what a node or user sent
		return 1
	}
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// dispatch walks the command tree along args and runs the leaf it reaches.
func (inv *invocation) dispatch(ctx context.Context, args []string) error {
	if len(args) == 0 {
		inv.printUsage(inv.stderr, nil, "")
		return exitCode(2)
	}
	if isHelp(args[0]) {
		if len(args) == 1 {
			inv.printUsage(inv.stdout, nil, "")
			return nil
		}
		// "help run submit" is "run submit --help".
		return inv.dispatch(ctx, append(append([]string{}, args[1:]...), "--help"))
	}
	cmd, ok := commands[args[0]]
	if !ok {
		return usagef("unknown command %q", args[0])
	}
	inv.path = cmd.name
	args = args[1:]
	for cmd.subs != nil {
		if len(args) == 0 {
			inv.printUsage(inv.stderr, cmd.subs, inv.path)
			return exitCode(2)
		}
		if isHelp(args[0]) {
			inv.printUsage(inv.stdout, cmd.subs, inv.path)
			return nil
		}
		sub, ok := cmd.subs[args[0]]
		if !ok {
			return usagef("unknown command %q", inv.path+" "+args[0])
		}
		cmd, inv.path, args = sub, inv.path+" "+sub.name, args[1:]
	}
	return cmd.run(ctx, inv, args)
}

// printUsage lists every leaf command under subs (the whole registry when
// subs is nil) with its one-line summary.
func (inv *invocation) printUsage(w io.Writer, subs map[string]*command, prefix string) {
	if subs == nil {
		subs = commands
		fmt.Fprint(w, "Usage: mercator <command> [flags] [args]\n\n"+
			"Mercator runs containerized workloads on a fleet of machines.\n\n")
	} else {
		fmt.Fprintf(w, "Usage: mercator %s <command> [flags] [args]\n\n", prefix)
	}
	fmt.Fprintln(w, "Commands:")
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	var walk func(prefix string, m map[string]*command)
	walk = func(prefix string, m map[string]*command) {
		for _, name := range sortedKeys(m) {
			c := m[name]
			full := strings.TrimSpace(prefix + " " + c.name)
			if c.subs != nil {
				walk(full, c.subs)
				continue
			}
			fmt.Fprintf(tw, "  %s\t%s\n", full, c.summary)
		}
	}
	walk(prefix, subs)
	_ = tw.Flush()
	fmt.Fprintln(w, "\nRun 'mercator <command> --help' for a command's flags.")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// flagSet is a flag.FlagSet that knows the command's synopsis and help, so
// --help prints them, and that lets flags follow positional arguments.
type flagSet struct {
	*flag.FlagSet
	inv      *invocation
	synopsis string
	help     string
	// short maps a long flag name to its one-letter alias ("output" → "o").
	short map[string]string
	alias map[string]bool
}

// flags returns a new flag set for the command being run. synopsis follows
// "mercator <path>" in the usage line ("[flags] RUN_ID"); help is the
// description, which may span paragraphs.
func (inv *invocation) flags(synopsis, help string) *flagSet {
	fs := flag.NewFlagSet(inv.path, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, inv: inv, synopsis: synopsis, help: help,
		short: map[string]string{}, alias: map[string]bool{}}
}

// aliasShort makes -s another name of the already defined flag --long.
func (f *flagSet) aliasShort(s, long string) {
	fl := f.Lookup(long)
	f.Var(fl.Value, s, fl.Usage)
	f.short[long] = s
	f.alias[s] = true
}

// parse parses args, letting flags and positional arguments mix ("run get
// RUN_ID -o json"); everything after "--" is positional. It returns the
// positional arguments. --help prints the command's help to stdout and
// returns exitCode(0); a bad flag is a usage error.
func (f *flagSet) parse(args []string) ([]string, error) {
	var pos []string
	for {
		if err := f.Parse(args); err != nil {
			return nil, f.failed(err)
		}
		rest := f.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// parseHead parses flags up to the first positional argument or "--" and
// returns the rest untouched: for commands whose arguments are another
// command line (`run submit … -- CMD ARGS`).
func (f *flagSet) parseHead(args []string) ([]string, error) {
	if err := f.Parse(args); err != nil {
		return nil, f.failed(err)
	}
	return f.Args(), nil
}

func (f *flagSet) failed(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		f.printHelp(f.inv.stdout)
		return exitCode(0)
	}
	// The flag package names a flag with one dash; the CLI's are long.
	return usagef("%s", strings.Replace(err.Error(), "for flag -", "for flag --", 1))
}

// printHelp prints the usage line, the help and the flags, long names with
// two dashes.
func (f *flagSet) printHelp(w io.Writer) {
	fmt.Fprintf(w, "Usage: mercator %s %s\n\n%s\n", f.inv.path, f.synopsis, strings.TrimSpace(f.help))
	var lines [][2]string
	f.VisitAll(func(fl *flag.Flag) {
		if f.alias[fl.Name] {
			return
		}
		name := "--" + fl.Name
		if len(fl.Name) == 1 {
			name = "-" + fl.Name
		}
		if s := f.short[fl.Name]; s != "" {
			name = "-" + s + ", " + name
		}
		typ, usage := flag.UnquoteUsage(fl)
		if typ != "" {
			name += " " + typ
		}
		if d := fl.DefValue; d != "" && d != "0" && d != "false" && d != "0s" && d != "[]" {
			usage += fmt.Sprintf(" (default %s)", d)
		}
		lines = append(lines, [2]string{name, usage})
	})
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\nFlags:")
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, l := range lines {
		fmt.Fprintf(tw, "  %s\t%s\n", l[0], l[1])
	}
	_ = tw.Flush()
}

// clientFlags are the flags every client command takes.
type clientFlags struct {
	addr      string
	tokenFile string
	caFile    string
	output    string // "table" or "json"; "" when the command prints no object
}

// clientFlags defines --addr and --token-file, and -o/--output when the
// command prints an object.
func (f *flagSet) clientFlags(withOutput bool) *clientFlags {
	g := &clientFlags{}
	f.StringVar(&g.addr, "addr", "", "control plane `URL` (default: $MERCATOR_ADDR, then the context file of `mercator dev`)")
	f.StringVar(&g.tokenFile, "token-file", "", "read the bearer token from `file` (default: $MERCATOR_TOKEN, then the context file)")
	f.StringVar(&g.caFile, "ca-file", "", "verify the server with the CA certificate in `file` (default: $MERCATOR_CA_FILE, then the context's CA, else the system's CAs)")
	if withOutput {
		f.StringVar(&g.output, "output", "table", "output `format`: table or json")
		f.aliasShort("o", "output")
	}
	return g
}

// check validates the flag values; it is called after parsing.
func (g *clientFlags) check() error {
	if g.output != "" && g.output != "table" && g.output != "json" {
		return usagef("--output must be table or json, not %q", g.output)
	}
	return nil
}

// json reports whether the user asked for JSON output.
func (g *clientFlags) json() bool { return g.output == "json" }

// client builds the API client from the flags, the environment and the
// context file (see client.LoadConfigOverrides for the precedence).
func (inv *invocation) client(g *clientFlags) (*client.Client, error) {
	cfg, err := client.LoadConfigOverrides(inv.env, client.Overrides{Addr: g.addr, TokenFile: g.tokenFile, CAFile: g.caFile})
	if err != nil {
		return nil, err
	}
	return client.NewFromConfig(cfg)
}

// connect parses args for a client command taking one positional argument
// (named what in messages), or none when what is "", and returns a client
// with the argument.
func (inv *invocation) connect(fs *flagSet, g *clientFlags, args []string, what string) (*client.Client, string, error) {
	arg := ""
	c, err := inv.connectWith(fs, g, args, func(pos []string) (err error) {
		if what != "" {
			arg, err = oneArg(pos, what)
		} else if len(pos) > 0 {
			err = usagef("unexpected argument %q", pos[0])
		}
		return err
	})
	return c, arg, err
}

// connectWith is connect for any positional arguments: it parses args,
// checks the client flags, checks the positional arguments with valid, and
// only then builds the client, so a usage error is reported as one.
func (inv *invocation) connectWith(fs *flagSet, g *clientFlags, args []string, valid func(pos []string) error) (*client.Client, error) {
	pos, err := fs.parse(args)
	if err != nil {
		return nil, err
	}
	if err := g.check(); err != nil {
		return nil, err
	}
	if err := valid(pos); err != nil {
		return nil, err
	}
	return inv.client(g)
}

// writeJSON prints v indented, as `-o json` promises.
func (inv *invocation) writeJSON(v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(inv.stdout, "%s\n", raw)
	return err
}

// stderrIsTerminal reports whether progress lines would reach a person.
func (inv *invocation) stderrIsTerminal() bool { return termtext.IsTerminal(inv.stderr) }

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

// rawFlag defines --raw for the commands that print a workload's output
// (termtext.Output).
func rawFlag(fs *flagSet) *bool {
	return fs.Bool("raw", false, "on a terminal, pass the workload's control characters and escape sequences through instead of escaping them")
}
