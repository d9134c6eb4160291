package signals

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// drain runs the outbox's loop over what is queued now and returns the
// notifications it sent.
func drain(o *Outbox) []string {
	var sent []string
	ctx, cancel := context.WithCancel(context.Background())
	o.Run(ctx, func(p string) {
		sent = append(sent, p)
		if len(o.queue) == 0 {
			cancel()
		}
	})
	return sent
}

// TestBatchDropsDuplicatesAndSplitsBack: signals queued together leave as
// one notification, duplicates once, and Split gives them back in order.
func TestBatchDropsDuplicatesAndSplitsBack(t *testing.T) {
	o := NewOutbox(16, nil)
	for _, s := range []string{"runs", "node:a", "runs", "logs", "node:a"} {
		o.Queue(s)
	}
	sent := drain(o)
	if len(sent) != 1 || !strings.HasPrefix(sent[0], BatchPrefix) {
		t.Fatalf("sent = %q, want one batch", sent)
	}
	if got, want := Split(sent[0]), []string{"runs", "node:a", "logs"}; !slices.Equal(got, want) {
		t.Fatalf("Split = %q, want %q", got, want)
	}
	if got := Split("reconcile"); !slices.Equal(got, []string{"reconcile"}) {
		t.Fatalf("Split of a lone signal = %q", got)
	}
}

// TestBatchesStayUnderMaxPayload: many distinct signals leave as several
// notifications, each within MaxPayload, none lost.
func TestBatchesStayUnderMaxPayload(t *testing.T) {
	o := NewOutbox(1<<12, nil)
	var want []string
	for i := range 2000 {
		s := fmt.Sprintf("node:node-%04d", i)
		want = append(want, s)
		o.Queue(s)
	}
	var got []string
	sent := drain(o)
	for _, p := range sent {
		if len(p) > MaxPayload {
			t.Fatalf("a notification of %d bytes, over %d", len(p), MaxPayload)
		}
		got = append(got, Split(p)...)
	}
	if len(sent) < 2 || !slices.Equal(got, want) {
		t.Fatalf("%d notifications carried %d signals, want all %d in order", len(sent), len(got), len(want))
	}
}

// TestQueueIDsFitAndParse: ids are split over signals that fit a batch
// with its prefix, and RunIDs reads back the sender and every id.
func TestQueueIDsFitAndParse(t *testing.T) {
	o := NewOutbox(64, nil)
	var ids []string
	for i := range 1500 {
		ids = append(ids, fmt.Sprintf("run-%06d", i))
	}
	o.QueueIDs("runs:", "r1", ids)
	var got []string
	n := len(o.queue)
	for range n {
		s := <-o.queue
		if len(BatchPrefix)+len(s) > MaxPayload {
			t.Fatalf("a signal of %d bytes does not fit a batch", len(s))
		}
		from, part := RunIDs("runs:", s)
		if from != "r1" {
			t.Fatalf("from = %q, want r1", from)
		}
		got = append(got, part...)
	}
	if n < 2 || !slices.Equal(got, ids) {
		t.Fatalf("%d signals carried %d ids, want %d", n, len(got), len(ids))
	}
}

// TestFullQueueDrops: a signal that does not fit is dropped and counted,
// not waited for.
func TestFullQueueDrops(t *testing.T) {
	dropped := 0
	o := NewOutbox(2, func() { dropped++ })
	for _, s := range []string{"a", "b", "c", "d"} {
		o.Queue(s)
	}
	if dropped != 2 || len(o.queue) != 2 {
		t.Fatalf("dropped %d, queued %d; want 2 and 2", dropped, len(o.queue))
	}
	// What was dropped is said in the next batch, once.
	if got := Split(strings.Join(drain(o), "")); !slices.Equal(got, []string{"a", "b", Lost}) {
		t.Fatalf("batch after drops = %q, want a, b and Lost", got)
	}
	o.Queue("e")
	if got := drain(o); len(got) != 1 || !slices.Equal(Split(got[0]), []string{"e"}) {
		t.Fatalf("the batch after that = %q, want e alone", got)
	}
}
