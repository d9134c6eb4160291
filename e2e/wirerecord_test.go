package e2e

import (
	"bytes"
	"strings"
	"sync"

	"github.com/mercator/mercator/internal/faultproxy"
)

// wireRecorder is a faultproxy.Tap that keeps every byte between the
// agents and the control plane, both ways.
type wireRecorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *wireRecorder) Data(_ uint64, _ faultproxy.Direction, p []byte) faultproxy.Verdict {
	w.mu.Lock()
	w.buf.Write(p)
	w.mu.Unlock()
	return faultproxy.Forward
}

func (w *wireRecorder) Closed(uint64) {}

// contains reports whether s went over the wire, either way.
func (w *wireRecorder) contains(s string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Contains(w.buf.Bytes(), []byte(s))
}

// recordWire puts a recording proxy between the agents started from now on
// and the control plane.
func (c *cluster) recordWire() *wireRecorder {
	c.t.Helper()
	rec := &wireRecorder{}
	p, err := faultproxy.Start(strings.TrimPrefix(c.url, "http://"), faultproxy.WithTap(rec))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { p.Close() })
	c.agentURL = "http://" + p.Addr()
	return rec
}
