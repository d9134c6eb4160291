package callstream

import (
	"sync"
	"time"

	"github.com/mercator/mercator/internal/combiner"
	"github.com/mercator/mercator/nodeproto"
)

// Invokes writes invoke frames down a call answers stream's answer
// (nodeproto.HeaderCallInvokes), from the goroutines of the calls
// themselves (package combiner): a hot call at c=1 costs one write and no
// hand-off, and concurrent calls share writes (and TLS records). Safe for
// concurrent use.
type Invokes struct {
	frames    *combiner.Writer
	broken    chan struct{}
	breakOnce sync.Once
}

// writeTimeout bounds one write of invoke frames. A variable for tests.
var writeTimeout = 2 * time.Second

// newInvokes writes frames with write, from the senders' goroutines.
// write must not block for long (writeTimeout): an agent that stops
// reading (a connection gone silent) breaks the stream instead, and the
// commands go down the session.
func newInvokes(write func(p []byte) error) *Invokes {
	iv := &Invokes{broken: make(chan struct{})}
	iv.frames = combiner.New(func(p []byte) error {
		err := write(p)
		if err != nil {
			iv.breakOff()
		}
		return err
	})
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
	iv.frames.Fail()
	iv.breakOff()
}

// Send writes cmd's frame under fencing, or queues it for the write under
// way. false when the stream is closed or broken: the caller sends cmd
// another way. true means written or queued, not read: a frame lost with a
// broken stream is the caller's to send again (Broken).
func (iv *Invokes) Send(fencing uint64, cmd *nodeproto.InvokeCommand) bool {
	return iv.frames.Add(func(p []byte) ([]byte, bool) { return nodeproto.AppendInvokeFrame(p, fencing, cmd), true })
}

// close takes no more frames and waits for a write under way: the
// handler may return (ending the answer) only once nothing writes to it.
func (iv *Invokes) close() { iv.frames.Close() }
