package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/mercator/mercator/api"
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

// TestNodeGetPrintsNoEscapes: a node whose hostname, notes and GPU fields
// carry escape sequences cannot reach the operator's terminal through
// `node get` or `node ls`, and -o json still carries them exactly.
func TestNodeGetPrintsNoEscapes(t *testing.T) {
	f := newFakeAPI(t)
	n := sampleNode()
	evil := "box\x1b[2J\x1b[H\rStatus: ready\u009b31m\x1b]0;owned\x07"
	(*n.Facts)["hostname"] = evil
	(*n.Facts)["notes"] = []any{"note\x1b]52;c;ZWNobyBoaQ==\x07", "tab\there"}
	(*n.Facts)["accelerators"] = []any{map[string]any{"vendor": "nvidia\x1b[8m", "model": "H100\r", "uuid": "GPU-1\u202e", "memory_bytes": float64(80 << 30)}}
	(*n.Facts)["runtime_name"] = "docker\x9b"
	n.Running = []string{"r-7/1\x1b[2K"}
	n.Flags = []api.NodeFlag{{Kind: api.NodeFlagGPUDisputed, GPU: "GPU-1\x1b[2J", Detail: "also claimed\n by \x1b[1mb", Since: t0}}
	f.nodes["n-1"] = n
	for _, args := range [][]string{{"node", "get", "n-1"}, {"node", "ls"}} {
		res := f.cli(t, args...)
		if res.code != 0 {
			t.Fatalf("%v: exit %d: %s", args, res.code, res.stderr)
		}
		if hasControl(res.stdout) || hasControl(res.stderr) {
			t.Errorf("%v printed a control character:\n%q", args, res.stdout)
		}
	}
	res := f.cli(t, "node", "get", "n-1")
	for _, want := range []string{`box\x1b[2J\x1b[H\rStatus: ready\u009b31m\x1b]0;owned\x07`, `tab\there`, `GPU-1\u202e`,
		`Flags:`, `gpu_disputed GPU-1\x1b[2J`, `also claimed\n by \x1b[1mb`} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("node get lacks %q:\n%s", want, res.stdout)
		}
	}
	// The forged "Status: ready" did not start a row of its own.
	if rows := strings.Count("\n"+res.stdout, "\nStatus:"); rows != 1 {
		t.Errorf("%d rows start with Status:, want 1:\n%s", rows, res.stdout)
	}
	res = f.cli(t, "node", "get", "n-1", "-o", "json")
	var got api.Node
	if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if (*got.Facts)["hostname"] != evil {
		t.Fatalf("JSON hostname = %q, want it exact", (*got.Facts)["hostname"])
	}
}

// TestRunAndErrorOutputPrintsNoEscapes: the run table and an error the
// server sends are escaped too.
func TestRunAndErrorOutputPrintsNoEscapes(t *testing.T) {
	f := newFakeAPI(t)
	r := sampleRun()
	r.Image, r.Reason = "img\x1b[2J", "failed\rsucceeded"
	r.Command = []string{"sh", "-c", "echo \x1b]0;x\x07"}
	r.Attempts[0].Error = "oom\x9b"
	f.addRun(r)
	for _, args := range [][]string{{"run", "get", r.ID}, {"run", "ls"}, {"run", "get", "no-such\x1b[2J"}} {
		res := f.cli(t, args...)
		if hasControl(res.stdout) || hasControl(res.stderr) {
			t.Errorf("%q printed a control character:\nstdout %q\nstderr %q", args, res.stdout, res.stderr)
		}
	}
}
