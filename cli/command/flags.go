package command

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// FlagSet is a flag.FlagSet that knows the command's synopsis and help, so
// --help prints them, and that lets flags follow positional arguments.
type FlagSet struct {
	*flag.FlagSet
	inv      *Invocation
	synopsis string
	help     string
	// short maps a long flag name to its one-letter alias ("output" → "o").
	short map[string]string
	alias map[string]bool
}

// Flags returns a new flag set for the command being run. synopsis follows
// "mercator <path>" in the usage line ("[flags] RUN_ID"); help is the
// description, which may span paragraphs.
func (inv *Invocation) Flags(synopsis, help string) *FlagSet {
	fs := flag.NewFlagSet(inv.Path, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &FlagSet{FlagSet: fs, inv: inv, synopsis: synopsis, help: help,
		short: map[string]string{}, alias: map[string]bool{}}
}

// AliasShort makes -s another name of the already defined flag --long.
func (f *FlagSet) AliasShort(s, long string) {
	fl := f.Lookup(long)
	f.Var(fl.Value, s, fl.Usage)
	f.short[long] = s
	f.alias[s] = true
}

// Parse parses args, letting flags and positional arguments mix ("run get
// RUN_ID -o json"); everything after "--" is positional. It returns the
// positional arguments. --help prints the command's help to stdout and
// returns ExitCode(0); a bad flag is a usage error. It hides the embedded
// flag.FlagSet's Parse, which stops at the first positional argument.
func (f *FlagSet) Parse(args []string) ([]string, error) {
	var pos []string
	for {
		if err := f.FlagSet.Parse(args); err != nil {
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

// ParseHead parses flags up to the first positional argument or "--" and
// returns the rest untouched: for commands whose arguments are another
// command line (`run submit … -- CMD ARGS`).
func (f *FlagSet) ParseHead(args []string) ([]string, error) {
	if err := f.FlagSet.Parse(args); err != nil {
		return nil, f.failed(err)
	}
	return f.Args(), nil
}

func (f *FlagSet) failed(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		f.printHelp(f.inv.Stdout)
		return ExitCode(0)
	}
	// The flag package names a flag with one dash; the CLI's are long.
	return Usagef("%s", strings.Replace(err.Error(), "for flag -", "for flag --", 1))
}

// printHelp prints the usage line, the help and the flags, long names with
// two dashes.
func (f *FlagSet) printHelp(w io.Writer) {
	fmt.Fprintf(w, "Usage: mercator %s %s\n\n%s\n", f.inv.Path, f.synopsis, strings.TrimSpace(f.help))
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
