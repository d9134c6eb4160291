package daemon

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/mercator/mercator/fnagent"
)

// TestFnSparesFlag: --fn-spares defaults to fnagent's default, 0 turns
// spares off (the engine's negative), and a count out of range is
// refused with the range.
func TestFnSparesFlag(t *testing.T) {
	parse := func(args ...string) (int, error) {
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		get := functionFlags(fs)
		if err := fs.Parse(args); err != nil {
			return 0, err
		}
		o, err := get()
		return o.Spares, err
	}
	if n, err := parse(); err != nil || n != fnagent.DefaultMaxSpares {
		t.Errorf("default: %d, %v; want %d", n, err, fnagent.DefaultMaxSpares)
	}
	if n, err := parse("--fn-spares", "0"); err != nil || n >= 0 {
		t.Errorf("--fn-spares 0: %d, %v; want spares off (negative)", n, err)
	}
	if n, err := parse("--fn-spares", "3"); err != nil || n != 3 {
		t.Errorf("--fn-spares 3: %d, %v", n, err)
	}
	for _, bad := range []string{"-1", "1001"} {
		if _, err := parse("--fn-spares", bad); err == nil || !strings.Contains(err.Error(), "from 0 (none) to 1000") {
			t.Errorf("--fn-spares %s: %v; want the range", bad, err)
		}
	}
}

// TestFnNetnsPoolFlag: --fn-netns-pool defaults to fnagent's default, 0
// turns the pool off (the engine's negative), and a count out of range is
// refused with the range.
func TestFnNetnsPoolFlag(t *testing.T) {
	parse := func(args ...string) (int, error) {
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		get := functionFlags(fs)
		if err := fs.Parse(args); err != nil {
			return 0, err
		}
		o, err := get()
		return o.NetnsPool, err
	}
	if n, err := parse(); err != nil || n != fnagent.DefaultNetnsPool {
		t.Errorf("default: %d, %v; want %d", n, err, fnagent.DefaultNetnsPool)
	}
	if n, err := parse("--fn-netns-pool", "0"); err != nil || n >= 0 {
		t.Errorf("--fn-netns-pool 0: %d, %v; want the pool off (negative)", n, err)
	}
	if n, err := parse("--fn-netns-pool", "5"); err != nil || n != 5 {
		t.Errorf("--fn-netns-pool 5: %d, %v", n, err)
	}
	for _, bad := range []string{"-1", "65"} {
		if _, err := parse("--fn-netns-pool", bad); err == nil || !strings.Contains(err.Error(), "from 0 (none) to 64") {
			t.Errorf("--fn-netns-pool %s: %v; want the range", bad, err)
		}
	}
}
