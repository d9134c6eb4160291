// Package termtext makes text written by others safe to print to a
// terminal.
//
// Much of what the CLI prints was written by someone else: a node's hostname,
// notes and GPU names, a run's image, command and reason, a function's name,
// an audit entry's route. A string holding ESC [ 2 J clears the operator's
// screen; a carriage return lets the text after it overwrite what came
// before ("ready" printed over "refused"); an OSC sequence sets the window
// title or, in some terminals, writes the clipboard; a bidirectional
// override shows text in another order than it is. So every text printer
// passes what it prints through Printable (by Fprintf and Fprintln), which
// replaces each such character with a visible Go-style escape: \x1b, \r,
// \u009b, \u202e. It does not escape the backslash, so a literal "\x1b"
// typed by someone reads the same as an escaped ESC: what matters is that
// neither reaches the terminal as one.
//
// JSON output is not its business: encoding/json escapes every C0 control
// already, and a program reading JSON wants the bytes the API gave. The
// output of a workload is the exception described at Writer. See
// docs/hardening.md, "Terminal output".
package termtext

import (
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"unicode/utf8"
)

// Printable returns s with every character that could command a terminal
// replaced by a visible escape: the C0 controls (tab and newline included,
// because in a table cell or a one-line field they forge columns and
// lines), DEL, the C1 controls U+0080–U+009F (U+009B is a one-character
// CSI), the bidirectional overrides and isolates, and bytes that are not
// UTF-8 (a lone 0x9b is CSI to a terminal that is not in UTF-8 mode).
func Printable(s string) string { return escapeControls(s, false) }

// Lines is Printable for text meant to span lines (an error
// message): newlines and tabs are kept, everything else is escaped.
func Lines(s string) string { return escapeControls(s, true) }

func escapeControls(s string, keepLines bool) string {
	clean := true
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if isControl(r, size, keepLines) {
			clean = false
			break
		}
		i += size
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if isControl(r, size, keepLines) {
			writeEscape(&b, r, s[i])
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// isControl reports whether the rune r (size bytes long; RuneError of size
// 1 is a byte that is not UTF-8) could command a terminal.
func isControl(r rune, size int, keepLines bool) bool {
	switch {
	case r == utf8.RuneError && size == 1:
		return true
	case r == '\n' || r == '\t':
		return !keepLines
	case r < 0x20 || r == 0x7f:
		return true
	case r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true // bidirectional embeddings, overrides and isolates
	}
	return false
}

// writeEscape writes r's visible escape; b0 is its first byte, for a byte
// that is not UTF-8.
func writeEscape(b *strings.Builder, r rune, b0 byte) {
	switch {
	case r == utf8.RuneError:
		fmt.Fprintf(b, `\x%02x`, b0)
	case r == '\n':
		b.WriteString(`\n`)
	case r == '\t':
		b.WriteString(`\t`)
	case r == '\r':
		b.WriteString(`\r`)
	case r < 0x80:
		fmt.Fprintf(b, `\x%02x`, r)
	default:
		fmt.Fprintf(b, `\u%04x`, r)
	}
}

// Fprintf is fmt.Fprintf for text meant for a person: every string in args
// (a string, a type whose kind is string, a slice of them, an error or a
// fmt.Stringer) is passed through Printable first (an error through
// Lines), while format, the CLI's own, is kept. Numbers are
// printed as they are.
func Fprintf(w io.Writer, format string, args ...any) (int, error) {
	return fmt.Fprintf(w, format, printableArgs(args)...)
}

// Fprintln is fmt.Fprintln with args made printable as Fprintf does.
func Fprintln(w io.Writer, args ...any) (int, error) {
	return fmt.Fprintln(w, printableArgs(args)...)
}

func printableArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = printableArg(a)
	}
	return out
}

func printableArg(a any) any {
	switch v := a.(type) {
	case nil:
		return nil
	case string:
		return Printable(v)
	case error:
		return Lines(v.Error())
	case fmt.Stringer:
		return Printable(v.String())
	}
	rv := reflect.ValueOf(a)
	switch {
	case rv.Kind() == reflect.String:
		return Printable(rv.String())
	case rv.Kind() == reflect.Slice && rv.Type().Elem().Kind() == reflect.String:
		out := make([]string, rv.Len())
		for i := range out {
			out[i] = Printable(rv.Index(i).String())
		}
		return out
	}
	return a
}

// Writer passes a workload's output to a terminal with the controls that
// could command it escaped, keeping newlines and tabs, which its output
// uses to be readable. It is what `mercator run logs`, `mercator fn logs`
// and `mercator fn invoke` write through (Output) when their standard
// output is a terminal, unless --raw is given:
// the output comes from the workload and, on its way, from the node, and
// either may be hostile. Colours and progress bars are lost with it, which
// is what --raw is for; written to a file or a pipe, the output is byte
// for byte. A UTF-8 sequence split between two writes is held until it is
// whole, so it is judged as one character.
type Writer struct {
	w       io.Writer
	pending []byte
}

// Write writes data with its controls escaped, holding back a trailing
// UTF-8 sequence that is not yet whole.
func (p *Writer) Write(data []byte) (int, error) {
	buf := append(p.pending, data...)
	// Keep back a trailing sequence that may yet become a whole rune.
	cut := len(buf)
	for k := 1; k < utf8.UTFMax && k <= len(buf); k++ {
		if utf8.RuneStart(buf[len(buf)-k]) {
			if !utf8.FullRune(buf[len(buf)-k:]) {
				cut = len(buf) - k
			}
			break
		}
	}
	p.pending = append([]byte(nil), buf[cut:]...)
	if _, err := io.WriteString(p.w, Lines(string(buf[:cut]))); err != nil {
		return 0, err
	}
	return len(data), nil
}

// Flush writes what was held back (an incomplete sequence at the end of
// the output, escaped as the bytes it is).
func (p *Writer) Flush() error {
	if len(p.pending) == 0 {
		return nil
	}
	_, err := io.WriteString(p.w, Lines(string(p.pending)))
	p.pending = nil
	return err
}

// Output is where output written by a workload (a run's log, a function's
// call log or response) goes, when its destination is w: w itself when raw
// is set or w is not a terminal, else a Writer over it. finish flushes what
// the Writer held back once the output ended, and returns err, or the
// flush's error when err is nil.
func Output(w io.Writer, raw bool) (out io.Writer, finish func(err error) error) {
	if raw || !IsTerminal(w) {
		return w, func(err error) error { return err }
	}
	p := &Writer{w: w}
	return p, func(err error) error {
		if ferr := p.Flush(); err == nil {
			err = ferr
		}
		return err
	}
}

// IsTerminal reports whether w is a terminal (a character device).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
