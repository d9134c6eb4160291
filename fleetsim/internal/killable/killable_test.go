package killable

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestKillEndsEveryConnection: Drop ends every accepted connection (their
// peers read EOF) and keeps accepting; Kill ends the new ones and the
// listener, so a dial after it is refused.
func TestKillEndsEveryConnection(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	l := New(raw, &accepted)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go io.Copy(io.Discard, c) // a server reading, as one mid-stream does
		}
	}()
	dial := func(n int) []net.Conn {
		want := accepted.Load() + int64(n)
		var out []net.Conn
		for range n {
			c, err := net.Dial("tcp", raw.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, c)
		}
		for deadline := time.Now().Add(10 * time.Second); accepted.Load() < want && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		return out
	}
	ended := func(conns []net.Conn) {
		t.Helper()
		for i, c := range conns {
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("connection %d read %v after it was ended, want EOF", i, err)
			}
			c.Close()
		}
	}
	first := dial(20)
	if n := l.Drop(); n != 20 {
		t.Errorf("Drop closed %d connections, want 20", n)
	}
	ended(first)
	second := dial(5)
	if accepted.Load() != 25 {
		t.Errorf("%d accepted, want 25: Drop keeps accepting", accepted.Load())
	}
	l.Kill()
	ended(second)
	if c, err := net.DialTimeout("tcp", raw.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Error("a dial after Kill succeeded")
	}
}
