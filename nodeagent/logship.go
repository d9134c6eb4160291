package nodeagent

import (
	"io"
	"sync"
)

// logChunkMax is the most one log delivery carries, and logBufferMax the
// most a log stream may read ahead of its deliveries.
const (
	logChunkMax  = 64 << 10
	logBufferMax = 1 << 20
)

// logBuffer gathers what a log stream delivers while the previous chunk is
// on its way, so that each delivery carries whatever has arrived. The
// daemon frames output a line at a time and the stream hands over one
// frame a read: one delivery a read was one request and one stored row a
// line, which for a chatty workload was a request per 64 bytes and a
// database holding twice the log it kept.
type logBuffer struct {
	mu      sync.Mutex
	cond    sync.Cond
	data    []byte
	err     error // how the stream ended, once it has
	stopped bool  // the shipper gave up: fill returns
}

func newLogBuffer() *logBuffer {
	b := &logBuffer{}
	b.cond.L = &b.mu
	return b
}

// fill reads r into the buffer until r ends or stop is called, waiting
// while the buffer holds logBufferMax.
func (b *logBuffer) fill(r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		b.mu.Lock()
		for len(b.data) >= logBufferMax && !b.stopped {
			b.cond.Wait()
		}
		if b.stopped {
			b.mu.Unlock()
			return
		}
		b.data = append(b.data, buf[:n]...)
		if err != nil {
			b.err = err
		}
		b.cond.Broadcast()
		b.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// take waits for data and returns up to logChunkMax bytes of it, copied
// into dst; with nothing left it returns how the stream ended.
func (b *logBuffer) take(dst []byte) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.data) == 0 && b.err == nil {
		b.cond.Wait()
	}
	if len(b.data) == 0 {
		return dst[:0], b.err
	}
	n := min(len(b.data), logChunkMax)
	dst = append(dst[:0], b.data[:n]...)
	b.data = append(b.data[:0], b.data[n:]...)
	b.cond.Broadcast()
	return dst, nil
}

// stop releases fill, which returns at its next read.
func (b *logBuffer) stop() {
	b.mu.Lock()
	b.stopped = true
	b.cond.Broadcast()
	b.mu.Unlock()
}
