package callstream

import (
	"net/http"
	"sync"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// Invokes writes invoke frames down a call answers stream's answer
// (nodeproto.HeaderCallInvokes), from the goroutines of the calls
// themselves: a sender that finds no write under way writes what is
// queued, its own frame and any queued meanwhile, and keeps writing until
// nothing is left; one that finds a write under way queues its frame and
// returns. So a hot call at c=1 costs one write and no hand-off, and
// concurrent calls share writes (and TLS records). Safe for concurrent
// use.
type Invokes struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu      sync.Mutex
	idle    sync.Cond // signalled when a write ends
	pending []byte    // frames queued while a write is under way
	spare   []byte
	writing bool
	closed  bool

	broken    chan struct{}
	breakOnce sync.Once
}

// writeTimeout bounds one write of invoke frames. A variable for tests.
var writeTimeout = 2 * time.Second

func newInvokes(w http.ResponseWriter, rc *http.ResponseController) *Invokes {
	iv := &Invokes{w: w, rc: rc, broken: make(chan struct{})}
	iv.idle.L = &iv.mu
	return iv
}

// Broken is closed when frames sent here may not have reached the agent:
// a write failed, or the stream ended other than by the agent ending it.
// A caller still waiting for the answer to a command it sent here sends
// it again another way; the agent runs a rendezvous once.
func (iv *Invokes) Broken() <-chan struct{} { return iv.broken }

func (iv *Invokes) breakOff() { iv.breakOnce.Do(func() { close(iv.broken) }) }

// fail takes no more frames and closes Broken: the stream ended before
// the agent ended it.
func (iv *Invokes) fail() {
	iv.mu.Lock()
	iv.closed = true
	iv.mu.Unlock()
	iv.breakOff()
}

// Send writes cmd's frame under fencing, or queues it for the write under
// way. false when the stream is closed or broken: the caller sends cmd
// another way. true means written or queued, not read: a frame lost with a
// broken stream is the caller's to send again (Serve's broken).
func (iv *Invokes) Send(fencing uint64, cmd *nodeproto.InvokeCommand) bool {
	iv.mu.Lock()
	if iv.closed {
		iv.mu.Unlock()
		return false
	}
	iv.pending = nodeproto.AppendInvokeFrame(iv.pending, fencing, cmd)
	if iv.writing {
		iv.mu.Unlock()
		return true
	}
	iv.writing = true
	for len(iv.pending) > 0 && !iv.closed {
		out := iv.pending
		iv.pending = iv.spare[:0]
		iv.mu.Unlock()
		// A sender writes on its caller's goroutine, so no write may
		// block for long: an agent that stops reading (a connection
		// gone silent) breaks the stream instead, and the commands go
		// down the session.
		_ = iv.rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, err := iv.w.Write(out)
		if err == nil {
			err = iv.rc.Flush()
		}
		iv.mu.Lock()
		iv.spare = out[:0]
		if err != nil {
			iv.closed = true
			iv.breakOff()
		}
	}
	iv.writing = false
	iv.idle.Broadcast()
	iv.mu.Unlock()
	return true
}

// close takes no more frames and waits for a write under way: the
// handler may return (ending the answer) only once nothing writes to it.
func (iv *Invokes) close() {
	iv.mu.Lock()
	iv.closed = true
	for iv.writing {
		iv.idle.Wait()
	}
	iv.mu.Unlock()
}
