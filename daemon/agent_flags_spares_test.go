package daemon

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/mercator/mercator/fnagent"
	"github.com/mercator/mercator/nodeagent"
)

// TestFnCountFlags: --fn-spares and --fn-netns-pool default to fnagent's
// defaults, 0 turns each off (the engine's negative), and a count out of
// range is refused with the range.
func TestFnCountFlags(t *testing.T) {
	for _, tc := range []struct {
		flag     string
		def, max int
		get      func(nodeagent.FunctionsOptions) int
	}{
		{"--fn-spares", fnagent.DefaultMaxSpares, maxFnSpares, func(o nodeagent.FunctionsOptions) int { return o.Spares }},
		{"--fn-netns-pool", fnagent.DefaultNetnsPool, maxFnNetnsPool, func(o nodeagent.FunctionsOptions) int { return o.NetnsPool }},
	} {
		parse := func(args ...string) (int, error) {
			fs := flag.NewFlagSet("agent", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			get := functionFlags(fs, "")
			if err := fs.Parse(args); err != nil {
				return 0, err
			}
			o, err := get()
			return tc.get(o), err
		}
		if n, err := parse(); err != nil || n != tc.def {
			t.Errorf("%s default: %d, %v; want %d", tc.flag, n, err, tc.def)
		}
		if n, err := parse(tc.flag, "0"); err != nil || n >= 0 {
			t.Errorf("%s 0: %d, %v; want it off (negative)", tc.flag, n, err)
		}
		if n, err := parse(tc.flag, "3"); err != nil || n != 3 {
			t.Errorf("%s 3: %d, %v", tc.flag, n, err)
		}
		for _, bad := range []string{"-1", fmt.Sprint(tc.max + 1)} {
			if _, err := parse(tc.flag, bad); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("from 0 (none) to %d", tc.max)) {
				t.Errorf("%s %s: %v; want the range", tc.flag, bad, err)
			}
		}
	}
}

// TestFnOutputRelayFlag: auto by default (resolved when the agent starts),
// off, or an absolute path; a relative path is refused with what to give.
func TestFnOutputRelayFlag(t *testing.T) {
	parse := func(args ...string) (string, error) {
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		get := functionFlags(fs, "")
		if err := fs.Parse(args); err != nil {
			return "", err
		}
		o, err := get()
		return o.OutputRelay, err
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, OutputRelayAuto},
		{[]string{"--fn-output-relay", "auto"}, OutputRelayAuto},
		{[]string{"--fn-output-relay", "off"}, ""},
		{[]string{"--fn-output-relay", "/opt/mercator/../mercator/bin/mercator"}, "/opt/mercator/bin/mercator"},
	} {
		if got, err := parse(tc.args...); err != nil || got != tc.want {
			t.Errorf("%q: %q, %v; want %q", tc.args, got, err, tc.want)
		}
	}
	if _, err := parse("--fn-output-relay", "bin/mercator"); err == nil || !strings.Contains(err.Error(), "absolute path") {
		t.Errorf("a relative path: %v; want it refused", err)
	}
}
