package daemon

import (
	"flag"
	"strings"
	"testing"
	"time"
)

// TestGPUSampleEveryBounded: the GPU sample period defaults to 10 s and a
// period outside 1 s to 1 h is refused, naming the flag.
func TestGPUSampleEveryBounded(t *testing.T) {
	parse := func(args ...string) (AgentOptions, error) {
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		options := AgentFlags(fs)
		if err := fs.Parse(append([]string{"--control-plane", "https://cp:7443", "--node-id", "n1"}, args...)); err != nil {
			t.Fatal(err)
		}
		return options()
	}
	if o, err := parse(); err != nil || o.GPUSampleEvery != 10*time.Second {
		t.Fatalf("default: %v, %v", o.GPUSampleEvery, err)
	}
	for _, bad := range []string{"10ms", "2h"} {
		if _, err := parse("--gpu-sample-every", bad); err == nil || !strings.Contains(err.Error(), "--gpu-sample-every") {
			t.Errorf("--gpu-sample-every %s: %v", bad, err)
		}
	}
}
