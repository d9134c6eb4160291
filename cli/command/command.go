// Package command is the plumbing every mercator command is written with:
// one invocation of the command line (its streams, environment, clock and
// command path), the flag set with the CLI's conventions (--help, long
// flags with two dashes, flags after positional arguments), the client
// flags and connecting to the control plane, the errors that set the exit
// status, and the output helpers (JSON, table cells, units).
//
// Package cli owns the command table and Main; the packages of commands
// (cli itself, cli/fncmd) build on this one, so none of them imports
// another. See package cli's doc for how a command is written.
package command

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/termtext"
)

// Command is one entry of the command tree: a leaf with Run, or a group
// ("run", "node") with subcommands.
type Command struct {
	// Name is the word that selects the command.
	Name string
	// Summary is one line for command lists, starting with a capital letter
	// and without a final period.
	Summary string
	// Run executes a leaf with the arguments after its name. See package
	// cli's doc for what its error means.
	Run func(ctx context.Context, inv *Invocation, args []string) error
	// Subs are a group's subcommands by name.
	Subs map[string]*Command
}

// Invocation is one execution of the command line: its streams, environment
// and clock, and the path of the command being run ("run submit"), which
// messages name.
type Invocation struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Env            func(string) string
	Now            func() time.Time
	Path           string
}

// UsageError is a mistake in the command line; it exits 2.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

// Usagef reports a usage error (exit status 2).
func Usagef(format string, args ...any) error {
	return &UsageError{msg: fmt.Sprintf(format, args...)}
}

// ExitCode ends the command with the given status and no message.
type ExitCode int

func (e ExitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// SortedKeys returns m's keys in order, for output that does not change
// from one run to the next.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// OneArg checks that exactly one positional argument, named what, was given.
func OneArg(pos []string, what string) (string, error) {
	if len(pos) != 1 {
		return "", Usagef("want exactly one %s, got %d argument(s)", what, len(pos))
	}
	if strings.TrimSpace(pos[0]) == "" {
		return "", Usagef("%s must not be empty", what)
	}
	return pos[0], nil
}

// ClientFlags are the flags every client command takes.
type ClientFlags struct {
	addr      string
	tokenFile string
	caFile    string
	output    string // "table" or "json"; "" when the command prints no object
}

// ClientFlags defines --addr and --token-file, and -o/--output when the
// command prints an object.
func (f *FlagSet) ClientFlags(withOutput bool) *ClientFlags {
	g := &ClientFlags{}
	f.StringVar(&g.addr, "addr", "", "control plane `URL` (default: $MERCATOR_ADDR, then the context file of `mercator dev`)")
	f.StringVar(&g.tokenFile, "token-file", "", "read the bearer token from `file` (default: $MERCATOR_TOKEN, then the context file)")
	f.StringVar(&g.caFile, "ca-file", "", "verify the server with the CA certificate in `file` (default: $MERCATOR_CA_FILE, then the context's CA, else the system's CAs)")
	if withOutput {
		f.StringVar(&g.output, "output", "table", "output `format`: table or json")
		f.AliasShort("o", "output")
	}
	return g
}

// Check validates the flag values; it is called after parsing.
func (g *ClientFlags) Check() error {
	if g.output != "" {
		return CheckOutput(g.output)
	}
	return nil
}

// CheckOutput validates an -o/--output value: table or json.
func CheckOutput(output string) error {
	if output != "table" && output != "json" {
		return Usagef("--output must be table or json, not %q", output)
	}
	return nil
}

// JSON reports whether the user asked for JSON output.
func (g *ClientFlags) JSON() bool { return g.output == "json" }

// Client builds the API client from the flags, the environment and the
// context file (see client.LoadConfigOverrides for the precedence).
func (inv *Invocation) Client(g *ClientFlags) (*client.Client, error) {
	cfg, err := client.LoadConfigOverrides(inv.Env, client.Overrides{Addr: g.addr, TokenFile: g.tokenFile, CAFile: g.caFile})
	if err != nil {
		return nil, err
	}
	return client.NewFromConfig(cfg)
}

// Connect parses args for a client command taking one positional argument
// (named what in messages), or none when what is "", and returns a client
// with the argument.
func (inv *Invocation) Connect(fs *FlagSet, g *ClientFlags, args []string, what string) (*client.Client, string, error) {
	arg := ""
	c, err := inv.ConnectWith(fs, g, args, func(pos []string) (err error) {
		if what != "" {
			arg, err = OneArg(pos, what)
		} else if len(pos) > 0 {
			err = Usagef("unexpected argument %q", pos[0])
		}
		return err
	})
	return c, arg, err
}

// ConnectWith is Connect for any positional arguments: it parses args,
// checks the client flags, checks the positional arguments with valid, and
// only then builds the client, so a usage error is reported as one.
func (inv *Invocation) ConnectWith(fs *FlagSet, g *ClientFlags, args []string, valid func(pos []string) error) (*client.Client, error) {
	pos, err := fs.Parse(args)
	if err != nil {
		return nil, err
	}
	if err := g.Check(); err != nil {
		return nil, err
	}
	if err := valid(pos); err != nil {
		return nil, err
	}
	return inv.Client(g)
}

// WriteJSON prints v indented, as `-o json` promises.
func (inv *Invocation) WriteJSON(v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(inv.Stdout, "%s\n", raw)
	return err
}

// StderrIsTerminal reports whether progress lines would reach a person.
func (inv *Invocation) StderrIsTerminal() bool { return termtext.IsTerminal(inv.Stderr) }

// StringList is a repeatable string flag.
type StringList []string

func (l *StringList) String() string     { return strings.Join(*l, ",") }
func (l *StringList) Set(s string) error { *l = append(*l, s); return nil }

// KeyValues returns a repeatable KEY=VALUE flag's values as a map, nil
// when none were given; one without "=" or KEY is a usage error naming
// the flag, and saying what KEY= means (empty).
func KeyValues(flag string, list StringList, empty string) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, s := range list {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, Usagef("--%s %q: want KEY=VALUE (%s)", flag, s, empty)
		}
		m[k] = v
	}
	return m, nil
}

// RawFlag defines --raw for the commands that print a workload's output
// (termtext.Output).
func RawFlag(fs *FlagSet) *bool {
	return fs.Bool("raw", false, "on a terminal, pass the workload's control characters and escape sequences through instead of escaping them")
}
