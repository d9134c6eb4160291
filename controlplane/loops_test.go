package controlplane

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/mercator/mercator/internal/logbuffer"

	dto "github.com/prometheus/client_model/go"

	"github.com/mercator/mercator/controlplane/internal/groupcommit"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// A panic inside the group-commit loop (a caller's transaction with a bug)
// answers its caller with an error instead of ending the process; the loop
// is restarted (the next write commits), the panic is counted in
// mercator_loop_panics_total{loop="batch"} and logged with its stack.
func TestBatchLoopSurvivesAPanic(t *testing.T) {
	var logs logbuffer.Buffer
	srv := New(Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, memstore.New(), nil, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }()
	defer func() { cancel(); <-served }()
	for !srv.commits.Running() { // Serve starts the loops, then they run
		select {
		case err := <-served:
			t.Fatalf("Serve returned early: %v", err)
		default:
		}
	}

	err = srv.batch(ctx, func(tx store.Tx) error {
		var m map[string]int
		m["bug"]++ // assignment to a nil map
		return nil
	})
	if !errors.Is(err, groupcommit.ErrPanicked) {
		t.Fatalf("the panicking transaction's caller got %v; want groupcommit.ErrPanicked", err)
	}
	if err := srv.batch(ctx, func(tx store.Tx) error { return nil }); err != nil {
		t.Fatalf("write after the panic: %v", err)
	}
	var m dto.Metric
	if err := srv.metrics.LoopPanics.WithLabelValues("batch").Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n != 1 {
		t.Fatalf("mercator_loop_panics_total{loop=batch} = %v; want 1", n)
	}
	out := logs.String()
	for _, want := range []string{"loop panicked; restarting it", "loop=batch", "assignment to entry in nil map", "loops_test.go"} {
		if !strings.Contains(out, want) {
			t.Errorf("server log lacks %q", want)
		}
	}
}
