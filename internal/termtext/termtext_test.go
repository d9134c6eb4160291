package termtext

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// hasControl reports whether s holds anything a terminal would obey: a C0
// control other than newline, DEL, a C1 control, a bidirectional override,
// or a byte that is not UTF-8.
func hasControl(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	return strings.ContainsFunc(s, func(r rune) bool {
		return (r < 0x20 && r != '\n' && r != '\t') || (r >= 0x7f && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
	})
}

func TestPrintable(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"plain text is untouched", "gpu-node-01 ✓ 80 GB", "gpu-node-01 ✓ 80 GB"},
		{"clear screen", "box\x1b[2J\x1b[H", `box\x1b[2J\x1b[H`},
		{"carriage return forging a status", "refused\rready  ", `refused\rready  `},
		{"OSC title, BEL-terminated", "\x1b]0;pwned\x07host", `\x1b]0;pwned\x07host`},
		{"OSC 52 clipboard, ST-terminated", "\x1b]52;c;cm0gLXJmIH4=\x1b\\", `\x1b]52;c;cm0gLXJmIH4=\x1b\`},
		{"C1 CSI as UTF-8", "a\u009b2Jb", `a\u009b2Jb`},
		{"C1 CSI as a raw byte", "a\x9b2Jb", `a\x9b2Jb`},
		{"newline forging a row", "box\nStatus: ready", `box\nStatus: ready`},
		{"tab forging a column", "box\tready", `box\tready`},
		{"backspace and DEL", "ab\b\x7f", `ab\x08\x7f`},
		{"bidi override", "safe\u202etxt.exe", `safe\u202etxt.exe`},
		{"NUL", "a\x00b", `a\x00b`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Printable(tc.in)
			if got != tc.want {
				t.Fatalf("Printable(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if hasControl(got) {
				t.Fatalf("Printable(%q) = %q still holds a control", tc.in, got)
			}
		})
	}
	if got := Lines("line one\n\tline two\x1b[31m\r"); got != "line one\n\tline two\\x1b[31m\\r" {
		t.Fatalf("Lines kept or escaped the wrong things: %q", got)
	}
}

func TestFprintfEscapesArgumentsNotFormat(t *testing.T) {
	type role string // a named string type, as api's enums are
	var b bytes.Buffer
	Fprintf(&b, "%s:\t%s %v %d %q\n", "Host\x1b[2J", role("admin\r"), []string{"a\x1b", "b"}, 7, "x\x9b")
	Fprintln(&b, errors.New("server said:\nnode \x1b]0;t\x07 refused"))
	want := "Host\\x1b[2J:\tadmin\\r [a\\x1b b] 7 \"x\\\\x9b\"\nserver said:\nnode \\x1b]0;t\\x07 refused\n"
	if b.String() != want {
		t.Fatalf("got  %q\nwant %q", b.String(), want)
	}
}

// TestPrintableWriterJoinsSplitRunes: a log streamed in chunks is judged
// character by character even when a chunk ends inside one.
func TestPrintableWriterJoinsSplitRunes(t *testing.T) {
	var out bytes.Buffer
	w := &Writer{w: &out}
	in := "ok ✓\n\u009b2J\x1b[1mbold\r\n\tdone\xc2"
	for i := 0; i < len(in); i++ { // one byte per write: every split there is
		if n, err := w.Write([]byte{in[i]}); n != 1 || err != nil {
			t.Fatalf("write: %d %v", n, err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := "ok ✓\n\\u009b2J\\x1b[1mbold\\r\n\tdone\\xc2"
	if out.String() != want {
		t.Fatalf("got  %q\nwant %q", out.String(), want)
	}
}
