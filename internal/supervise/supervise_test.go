package supervise

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/internal/logbuffer"
)

// A loop that panics on its first two starts is restarted each time, the
// panic is counted and logged with its stack, and the third start's normal
// return ends Run.
func TestRunRestartsAPanickingLoop(t *testing.T) {
	var logs logbuffer.Buffer
	var starts, counted atomic.Int32
	s := Supervisor{Log: slog.New(slog.NewTextHandler(&logs, nil)), Backoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond,
		Panicked: func(loop string) {
			if loop != "test-loop" {
				t.Errorf("Panicked got loop %q", loop)
			}
			counted.Add(1)
		}}
	s.Run(context.Background(), "test-loop", func(ctx context.Context) {
		if starts.Add(1) <= 2 {
			var m map[string]int
			m["boom"]++ // a real bug: assignment to a nil map
		}
	})
	if starts.Load() != 3 || counted.Load() != 2 {
		t.Fatalf("starts %d, panics counted %d; want 3 and 2", starts.Load(), counted.Load())
	}
	out := logs.String()
	for _, want := range []string{"loop panicked; restarting it", "loop=test-loop", "assignment to entry in nil map", "supervise_test.go"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// Run returns when ctx ends during the backoff, without starting the loop
// again.
func TestRunStopsDuringBackoffWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var starts atomic.Int32
	s := Supervisor{Log: slog.New(slog.NewTextHandler(&logbuffer.Buffer{}, nil)), Backoff: time.Hour,
		Panicked: func(string) { cancel() }}
	s.Run(ctx, "cancelled", func(ctx context.Context) { starts.Add(1); panic("once") })
	if starts.Load() != 1 {
		t.Fatalf("loop started %d times; want 1", starts.Load())
	}
}
