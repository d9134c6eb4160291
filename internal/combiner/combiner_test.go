package combiner

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
)

func frame(s string) func([]byte) ([]byte, bool) {
	return func(p []byte) ([]byte, bool) { return append(p, s...), true }
}

// awaitWriting returns once a write of w is under way.
func awaitWriting(w *Writer) {
	for {
		w.mu.Lock()
		writing := w.writing
		w.mu.Unlock()
		if writing {
			return
		}
		runtime.Gosched()
	}
}

// TestAloneIsOneWrite: a frame added with no write under way is written
// at once, by the adding goroutine, in one write.
func TestAloneIsOneWrite(t *testing.T) {
	var writes [][]byte
	w := New(func(p []byte) error { writes = append(writes, bytes.Clone(p)); return nil })
	if !w.Add(frame("a")) || !w.Add(frame("b")) {
		t.Fatal("an open Writer refused a frame")
	}
	if len(writes) != 2 || string(writes[0]) != "a" || string(writes[1]) != "b" {
		t.Fatalf("writes %q; want a, then b", writes)
	}
}

// TestFramesAddedDuringAWriteShareTheNext: while one write is under way,
// frames added by other goroutines return at once and go out together in
// the next write, each whole and once.
func TestFramesAddedDuringAWriteShareTheNext(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var writes []string
	first := true
	w := New(func(p []byte) error {
		if first {
			first = false
			<-release // the first write blocks until the others are queued
		}
		mu.Lock()
		writes = append(writes, string(p))
		mu.Unlock()
		return nil
	})
	done := make(chan bool)
	go func() { done <- w.Add(frame("[0]")) }()
	awaitWriting(w) // the first write is under way
	var wg sync.WaitGroup
	for i := 1; i <= 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !w.Add(frame(fmt.Sprintf("[%d]", i))) {
				t.Error("an open Writer refused a frame")
			}
		}()
	}
	wg.Wait() // every one returned while the write was still blocked
	close(release)
	<-done
	if len(writes) != 2 || writes[0] != "[0]" {
		t.Fatalf("writes %q; want the first frame, then the other eight in one write", writes)
	}
	for i := 1; i <= 8; i++ {
		if n := bytes.Count([]byte(writes[1]), []byte(fmt.Sprintf("[%d]", i))); n != 1 {
			t.Fatalf("frame %d in the second write %d times: %q", i, n, writes[1])
		}
	}
}

// TestAFailedWriteCloses: the write that fails closes the Writer with its
// error; later frames are refused. A frame add refuses takes nothing.
func TestAFailedWriteCloses(t *testing.T) {
	boom := errors.New("boom")
	calls := 0
	w := New(func([]byte) error { calls++; return boom })
	if !w.Add(frame("a")) {
		t.Fatal("the frame whose write failed was refused; it was taken")
	}
	if closed, err := w.Closed(); !closed || !errors.Is(err, boom) {
		t.Fatalf("Closed() = %v, %v; want closed by the write's error", closed, err)
	}
	if w.Add(frame("b")) || calls != 1 {
		t.Fatalf("a closed Writer took a frame (%d writes)", calls)
	}
	ok := New(func([]byte) error { t.Error("wrote a refused frame"); return nil })
	if ok.Add(func(p []byte) ([]byte, bool) { return p, false }) {
		t.Fatal("a refused frame was reported taken")
	}
}

// TestCloseWaitsAndCloseIfIdleDoesNot: Close returns only once the write
// under way ended; CloseIfIdle never closes during a write, closes when
// idle says so, and Fail closes without waiting.
func TestCloseWaitsAndCloseIfIdleDoesNot(t *testing.T) {
	release, ended := make(chan struct{}), make(chan struct{})
	w := New(func([]byte) error { <-release; return nil })
	go func() { w.Add(frame("a")); close(ended) }()
	awaitWriting(w)
	if w.CloseIfIdle(func() bool { return true }) {
		t.Fatal("CloseIfIdle closed during a write")
	}
	closed := make(chan struct{})
	go func() { w.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned during a write")
	default:
	}
	close(release)
	<-ended
	<-closed
	if w.Add(frame("b")) {
		t.Fatal("a closed Writer took a frame")
	}

	idle := New(func([]byte) error { return nil })
	if idle.CloseIfIdle(func() bool { return false }) {
		t.Fatal("CloseIfIdle closed a Writer its condition kept open")
	}
	if !idle.CloseIfIdle(func() bool { return true }) || idle.Add(frame("c")) {
		t.Fatal("CloseIfIdle did not close an idle Writer")
	}
	failed := New(func([]byte) error { return nil })
	failed.Fail()
	if failed.Add(frame("d")) {
		t.Fatal("a failed Writer took a frame")
	}
}
