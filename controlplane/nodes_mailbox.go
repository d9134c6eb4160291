package controlplane

import (
	"sync"

	"github.com/mercator/mercator/nodeproto"
)

// A node's session stream learns of new operations by reading the store
// when it is woken. When the operations were created by this replica and
// the node's session is held here too (the common case with one replica,
// and for half the fleet with two), the reading is waste: the commands are
// in hand the moment their transaction commits. So the code that commits
// them (commitPlacements) hands them to every stream of the node attached
// here, which sends them without a store read. The store stays the
// authority: whatever a stream loses (it ended; the node's session is
// elsewhere) is sent from the store on the next read, which every new
// session starts with and every stream repeats now and then (sessionPoll); a
// stream's memory of what it sent keeps a command from being sent twice on
// it.
type mailbox struct {
	mu      sync.Mutex
	streams map[*inbox]bool
}

// inbox is one session stream's share of its node's mailbox.
type inbox struct {
	mu     sync.Mutex
	cmds   []nodeproto.Command
	notify chan struct{}
	node   *mailbox
}

// attachInbox registers a session stream of the node; detach it when the
// stream ends.
func (s *Server) attachInbox(nodeID string) *inbox {
	v, _ := s.mailboxes.LoadOrStore(nodeID, &mailbox{streams: map[*inbox]bool{}})
	mb := v.(*mailbox)
	in := &inbox{notify: make(chan struct{}, 1), node: mb}
	mb.mu.Lock()
	mb.streams[in] = true
	mb.mu.Unlock()
	return in
}

func (in *inbox) detach() {
	in.node.mu.Lock()
	delete(in.node.streams, in)
	in.node.mu.Unlock()
}

// take returns the commands waiting.
func (in *inbox) take() []nodeproto.Command {
	in.mu.Lock()
	defer in.mu.Unlock()
	cmds := in.cmds
	in.cmds = nil
	return cmds
}

// deliverLocal hands committed commands to the node's session streams
// attached here, and reports whether there was one.
func (s *Server) deliverLocal(nodeID string, cmds []nodeproto.Command) bool {
	v, ok := s.mailboxes.Load(nodeID)
	if !ok {
		return false
	}
	mb := v.(*mailbox)
	mb.mu.Lock()
	defer mb.mu.Unlock()
	for in := range mb.streams {
		in.mu.Lock()
		in.cmds = append(in.cmds, cmds...)
		in.mu.Unlock()
		select {
		case in.notify <- struct{}{}:
		default:
		}
	}
	return len(mb.streams) > 0
}
