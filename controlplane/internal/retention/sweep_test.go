package retention

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

// TestSweeper: a follower runs only Local tasks; a task is run again while
// it reports more, up to maxBatches a sweep; a failing task does not stop
// the others.
func TestSweeper(t *testing.T) {
	leading := false
	batches := map[string]int{}
	task := func(name string, local bool, more func(n int) bool, err error) Task {
		return Task{Name: name, Local: local, Batch: func(context.Context, time.Time) (int, bool, error) {
			batches[name]++
			return 10, more(batches[name]), err
		}}
	}
	s := &Sweeper{Now: time.Now, Leader: func() bool { return leading }, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tasks: []Task{
		task("shared", false, func(n int) bool { return n < 3 }, nil),
		task("broken", false, func(int) bool { return true }, errors.New("boom")),
		task("endless", false, func(int) bool { return true }, nil),
		task("local", true, func(int) bool { return false }, nil),
	}}
	got := s.Sweep(t.Context())
	if len(got) != 1 || got["local"] != 10 || batches["shared"] != 0 {
		t.Fatalf("a follower swept %v (batches %v); want the local task only", got, batches)
	}
	leading = true
	got = s.Sweep(t.Context())
	if got["shared"] != 30 || batches["broken"] != 1 || batches["endless"] != maxBatches || got["local"] != 10 {
		t.Fatalf("the leader swept %v in batches %v; want shared 3 batches, broken 1, endless %d, local 1", got, batches, maxBatches)
	}
}
