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

// TestGPUDiagFlags: the diagnostic looks for dcgmi on PATH and runs daily
// by default; --dcgmi "" turns it off, --gpu-diag-every 0 runs it only at
// the start, and a period under 10 minutes is refused.
func TestGPUDiagFlags(t *testing.T) {
	parse := func(args ...string) (AgentOptions, error) {
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		options := AgentFlags(fs)
		if err := fs.Parse(append([]string{"--control-plane", "https://cp:7443", "--node-id", "n1"}, args...)); err != nil {
			t.Fatal(err)
		}
		return options()
	}
	if o, err := parse(); err != nil || o.DCGMI != "dcgmi" || o.GPUDiagEvery != 24*time.Hour || o.ForgetGPUs {
		t.Fatalf("default: %+v, %v", o, err)
	}
	if o, err := parse("--dcgmi", "", "--gpu-diag-every", "0", "--forget-gpus"); err != nil || o.DCGMI != "" || o.GPUDiagEvery >= 0 || !o.ForgetGPUs {
		t.Fatalf("off, only at the start, forget: %+v, %v", o, err)
	}
	if _, err := parse("--gpu-diag-every", "1m"); err == nil || !strings.Contains(err.Error(), "--gpu-diag-every") {
		t.Errorf("--gpu-diag-every 1m: %v", err)
	}
}
