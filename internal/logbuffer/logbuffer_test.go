package logbuffer

import (
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWritesAllLand: writes from many goroutines, read while
// they run, all land whole (run with -race).
func TestConcurrentWritesAllLand(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				b.Write([]byte("line\n"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if n := strings.Count(b.String(), "line\n"); n != 800 {
		t.Fatalf("%d lines; want 800", n)
	}
}
