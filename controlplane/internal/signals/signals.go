// Package signals is the wire form of the control plane's signals to other
// replicas and the batching that sends them: an Outbox queues topics and
// its Run loop sends everything queued, duplicates dropped, as one
// notification of several lines (BatchPrefix), each under MaxPayload;
// Split takes such a notification apart again, and RunIDs parses the one
// kind of signal that names data ("runs:REPLICA:ID,ID,…").
//
// It exists so that the batching, which is pure and easy to get subtly
// wrong (payload limits, duplicates, a bounded queue), is tested on its
// own, apart from the Server that decides what a signal means
// (controlplane/replicas_signal.go). Signals carry no truth: a dropped
// one costs latency at worst, so a full queue drops rather than blocks,
// and says so afterwards by sending Lost.
// It does no I/O itself; the sender is given to Run. Only package
// controlplane imports it.
package signals

import (
	"context"
	"strings"
	"sync/atomic"
)

// BatchPrefix starts a notification that carries several signals, one a
// line.
const BatchPrefix = "signals\n"

// MaxPayload keeps a batch under PostgreSQL's NOTIFY payload limit (8000
// bytes).
const MaxPayload = 7000

// Lost stands for every signal at once: its receiver treats it as all of
// them (every waiter looks at the store again). An Outbox sends it after it
// had to drop a signal, and a replica's listener delivers it after it may
// have missed some (package replica sends the same string), so that a
// waiter need not read the store often on a timer to cover a lost one.
const Lost = "*"

// Outbox is a bounded queue of signals for the other replicas.
type Outbox struct {
	queue   chan string
	dropped func() // called for each signal that did not fit
	// lost is set when a signal was dropped and cleared when the batch
	// that carries Lost in its place leaves.
	lost atomic.Bool
}

// NewOutbox returns an outbox holding at most size signals; dropped (which
// may be nil) is called for each one that does not fit.
func NewOutbox(size int, dropped func()) *Outbox {
	return &Outbox{queue: make(chan string, size), dropped: dropped}
}

// Queue queues a signal without blocking; one that does not fit is
// dropped, and the next batch Run sends carries Lost.
func (o *Outbox) Queue(topic string) {
	select {
	case o.queue <- topic:
	default:
		o.lost.Store(true)
		if o.dropped != nil {
			o.dropped()
		}
	}
}

// QueueIDs queues signals naming ids, prefix+replica+":" then the ids
// separated by commas, split so each fits a notification.
func (o *Outbox) QueueIDs(prefix, replica string, ids []string) {
	head := prefix + replica + ":"
	var b strings.Builder
	for _, id := range ids {
		if b.Len() > 0 && b.Len()+len(id)+1 > MaxPayload-len(BatchPrefix)-len(head) {
			o.Queue(head + b.String())
			b.Reset()
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(id)
	}
	if b.Len() > 0 {
		o.Queue(head + b.String())
	}
}

// Run sends queued signals in batches until ctx ends: whatever is queued
// when it wakes, duplicates within a batch dropped, as notifications of at
// most MaxPayload bytes each, each given to send. After a drop, the last
// notification of the next batch ends with Lost (a full queue is not
// empty, so a batch follows).
func (o *Outbox) Run(ctx context.Context, send func(payload string)) {
	for {
		var first string
		select {
		case <-ctx.Done():
			return
		case first = <-o.queue:
		}
		seen := map[string]bool{first: true}
		var b strings.Builder
		b.WriteString(BatchPrefix)
		b.WriteString(first)
	more:
		for {
			select {
			case t := <-o.queue:
				if seen[t] {
					continue
				}
				if b.Len()+1+len(t) > MaxPayload {
					send(b.String())
					b.Reset()
					b.WriteString(BatchPrefix)
					b.WriteString(t)
					clear(seen)
					seen[t] = true
					continue
				}
				seen[t] = true
				b.WriteByte('\n')
				b.WriteString(t)
			default:
				break more
			}
		}
		if o.lost.Swap(false) {
			if b.Len()+1+len(Lost) > MaxPayload {
				send(b.String())
				b.Reset()
				b.WriteString(BatchPrefix)
				b.WriteString(Lost)
			} else {
				b.WriteByte('\n')
				b.WriteString(Lost)
			}
		}
		send(b.String())
	}
}

// Split is the signals a notification carries: a batch's lines, or the
// notification itself when it is not a batch.
func Split(payload string) []string {
	if rest, ok := strings.CutPrefix(payload, BatchPrefix); ok {
		return strings.Split(rest, "\n")
	}
	return []string{payload}
}

// RunIDs parses a signal QueueIDs made with prefix: the replica that sent
// it and the ids it names.
func RunIDs(prefix, topic string) (from string, ids []string) {
	rest := strings.TrimPrefix(topic, prefix)
	from, list, _ := strings.Cut(rest, ":")
	return from, strings.Split(list, ",")
}
