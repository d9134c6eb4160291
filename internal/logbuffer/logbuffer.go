// Package logbuffer is a log a process writes from many goroutines while a
// test reads it: what tests give a logger (slog, an agent's or a server's
// log) and then search. It exists because each package's tests had grown
// its own copy of the same dozen lines.
//
// Any package may import it, tests above all; it imports nothing of the
// module's own.
package logbuffer

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent Write and String. Its zero
// value is an empty buffer ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
