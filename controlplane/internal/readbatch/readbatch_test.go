package readbatch

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"
)

// reader is a read that records its batches and, while gate is set,
// blocks each batch until the test lets it through.
type reader struct {
	mu      sync.Mutex
	batches [][]int
	gate    chan struct{} // nil: no blocking
	entered chan struct{} // a batch began
	fail    error
	short   bool // answer one request too few
}

func (r *reader) read(_ context.Context, reqs []int) ([]string, error) {
	r.mu.Lock()
	r.batches = append(r.batches, append([]int(nil), reqs...))
	r.mu.Unlock()
	if r.entered != nil {
		r.entered <- struct{}{}
	}
	if r.gate != nil {
		<-r.gate
	}
	if r.fail != nil {
		return nil, r.fail
	}
	out := make([]string, len(reqs))
	for i, q := range reqs {
		out[i] = fmt.Sprint("answer ", q)
	}
	if r.short {
		out = out[1:]
	}
	return out, nil
}

func (r *reader) seen() [][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]int(nil), r.batches...)
}

// waitQueued waits until n requests wait in b's queue.
func waitQueued(t *testing.T, b *Batcher[int, string], n int) {
	t.Helper()
	for i := 0; ; i++ {
		b.mu.Lock()
		got := len(b.queue)
		b.mu.Unlock()
		if got == n {
			return
		}
		if i > 5000 {
			t.Fatalf("%d requests queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAloneIsReadAtOnce(t *testing.T) {
	r := &reader{}
	b := New(2, 10, r.read)
	got, err := b.Read(t.Context(), 7)
	if err != nil || got != "answer 7" {
		t.Fatalf("Read(7) = %q, %v", got, err)
	}
	if !reflect.DeepEqual(r.seen(), [][]int{{7}}) {
		t.Fatalf("batches %v, want [[7]]", r.seen())
	}
}

// TestWaitingRequestsJoin: requests made while the only slot reads are
// read together, each answered with its own answer, in batches of at most
// max.
func TestWaitingRequestsJoin(t *testing.T) {
	r := &reader{gate: make(chan struct{}), entered: make(chan struct{}, 10)}
	b := New(1, 3, r.read)
	answers := make([]string, 6)
	var wg sync.WaitGroup
	read := func(i int) {
		defer wg.Done()
		a, err := b.Read(context.Background(), i)
		if err != nil {
			t.Errorf("Read(%d): %v", i, err)
		}
		answers[i] = a
	}
	wg.Add(1)
	go read(0)
	<-r.entered // 0 is being read, alone
	for i := 1; i < 6; i++ {
		wg.Add(1)
		go read(i)
	}
	waitQueued(t, b, 5)
	close(r.gate)
	wg.Wait()
	batches := r.seen()
	if len(batches) != 3 || len(batches[0]) != 1 || len(batches[1]) != 3 || len(batches[2]) != 2 {
		t.Fatalf("batches %v, want [0] then the 5 waiting in batches of 3 and 2", batches)
	}
	for i, a := range answers {
		if a != fmt.Sprint("answer ", i) {
			t.Errorf("request %d answered %q", i, a)
		}
	}
}

// TestFailedReadFailsItsBatch: every request of a batch gets its error,
// as does a read that answers too few.
func TestFailedReadFailsItsBatch(t *testing.T) {
	boom := errors.New("store down")
	r := &reader{fail: boom}
	b := New(1, 10, r.read)
	if _, err := b.Read(t.Context(), 1); !errors.Is(err, boom) {
		t.Fatalf("Read = %v, want %v", err, boom)
	}
	short := New(1, 10, (&reader{short: true}).read)
	if _, err := short.Read(t.Context(), 1); err == nil {
		t.Fatal("a read answering too few: no error")
	}
}

// TestCancelledWhileQueuedIsWithdrawn: a request whose context ends while
// it waits returns at once and is not read.
func TestCancelledWhileQueuedIsWithdrawn(t *testing.T) {
	r := &reader{gate: make(chan struct{}), entered: make(chan struct{}, 10)}
	b := New(1, 10, r.read)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := b.Read(context.Background(), 0); err != nil {
			t.Errorf("Read(0): %v", err)
		}
	}()
	<-r.entered
	ctx, cancel := context.WithCancel(t.Context())
	gone := make(chan error)
	go func() {
		_, err := b.Read(ctx, 1)
		gone <- err
	}()
	waitQueued(t, b, 1)
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Read = %v", err)
	}
	close(r.gate)
	<-done
	if got := r.seen(); !reflect.DeepEqual(got, [][]int{{0}}) {
		t.Fatalf("batches %v, want only [0]: the withdrawn request is not read", got)
	}
}

// TestManyCallersAllAnswered: under concurrent load with several slots,
// every request is answered with its own answer.
func TestManyCallersAllAnswered(t *testing.T) {
	r := &reader{}
	b := New(3, 8, r.read)
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if a, err := b.Read(context.Background(), i); err != nil || a != fmt.Sprint("answer ", i) {
				t.Errorf("Read(%d) = %q, %v", i, a, err)
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, batch := range r.seen() {
		if len(batch) > 8 {
			t.Errorf("batch of %d, max 8", len(batch))
		}
		total += len(batch)
	}
	if total != 200 {
		t.Fatalf("%d requests read, want 200 (each once)", total)
	}
}
