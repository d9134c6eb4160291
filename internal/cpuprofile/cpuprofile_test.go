package cpuprofile

import (
	"bytes"
	"context"
	"runtime/pprof"
	"testing"
	"time"
)

// TestByLabel profiles this process while a goroutine labelled
// component=busy spins, and finds that label's CPU in the profile.
func TestByLabel(t *testing.T) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		t.Skipf("a CPU profile is already running: %v", err)
	}
	done := make(chan struct{})
	pprof.Do(context.Background(), pprof.Labels("component", "busy"), func(context.Context) {
		go func() {
			defer close(done)
			x := 0
			for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
				x++
			}
			_ = x
		}()
	})
	<-done
	pprof.StopCPUProfile()
	got, err := ByLabel(buf.Bytes(), "component")
	if err != nil {
		t.Fatal(err)
	}
	if got["busy"] <= 0 {
		t.Fatalf("no CPU for component=busy in %v", got)
	}
	if _, err := ByLabel([]byte("not a profile"), "component"); err == nil {
		t.Fatal("a body that is no gzipped profile was read without an error")
	}
}
