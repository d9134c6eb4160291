// Package combiner writes frames queued by many goroutines to one stream
// with no goroutine of its own. A goroutine that adds a frame while no
// write is under way writes it, with every frame queued meanwhile, and
// keeps writing until nothing is left; one that adds a frame while a write
// is under way leaves it for that write and returns at once. So a frame
// added alone costs one write and no hand-off to another goroutine (what
// a hot function call's command and answer need at one call in flight),
// and frames added together share writes (and TLS records) under load.
// The control plane's invokes down a call answers stream and the agent's
// answers up it are written so.
package combiner

import "sync"

// Writer queues frames and writes them with write, one write at a time.
// The first write to fail closes it: the frames of that write, and those
// queued behind it, are lost (their senders were told they were taken,
// and learn of the loss another way). Safe for concurrent use.
type Writer struct {
	write func([]byte) error

	mu      sync.Mutex
	idle    sync.Cond // signalled when a write ends
	pending []byte    // frames queued while a write is under way
	spare   []byte
	writing bool
	closed  bool
	err     error // the write that closed it, if one did
}

// New is a Writer that writes with write.
func New(write func([]byte) error) *Writer {
	w := &Writer{write: write}
	w.idle.L = &w.mu
	return w
}

// Add queues the frame add appends to the pending bytes and writes it
// (with any others queued) unless a write is under way. add returns the
// bytes with its frame appended, or false to take nothing (say, a frame
// over a limit); it runs under the Writer's lock and must be quick.
// Add reports whether the frame was taken: false when the Writer is
// closed or add refused.
func (w *Writer) Add(add func([]byte) ([]byte, bool)) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	next, ok := add(w.pending)
	if !ok {
		return false
	}
	w.pending = next
	if w.writing {
		return true
	}
	w.writing = true
	for len(w.pending) > 0 && !w.closed {
		out := w.pending
		w.pending = w.spare[:0]
		w.mu.Unlock()
		err := w.write(out)
		w.mu.Lock()
		w.spare = out[:0]
		if err != nil && !w.closed {
			w.closed, w.err = true, err
		}
	}
	w.writing = false
	w.idle.Broadcast()
	return true
}

// Close takes no more frames and waits for a write under way to end.
func (w *Writer) Close() {
	w.mu.Lock()
	w.closed = true
	for w.writing {
		w.idle.Wait()
	}
	w.mu.Unlock()
}

// Fail takes no more frames, without waiting for a write under way (one
// blocked on its stream ends when the stream is closed).
func (w *Writer) Fail() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

// CloseIfIdle closes the Writer when no write is under way and idle,
// called under its lock (so no frame is added meanwhile), says so; it
// reports whether it closed it.
func (w *Writer) CloseIfIdle(idle func() bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.writing || !idle() {
		return false
	}
	w.closed = true
	return true
}

// Closed reports whether the Writer takes no more frames, and the write
// error that closed it, if one did.
func (w *Writer) Closed() (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed, w.err
}
