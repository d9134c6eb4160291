package nodeagent

import "github.com/mercator/mercator/nodeproto"

// The event watermark (nodeproto.EventBatch.Through) tells the control
// plane which of this state file's events it may forget it applied: every
// event at or below it was either acknowledged (so applied: the control
// plane acknowledges only what it holds) or will never be sent. What could
// still be sent is what is owed (spooled, not acknowledged) and what was
// minted but is not spooled yet (NextEventID and the spooling write are
// apart), so the watermark is just below the lowest of those, or below the
// next ID to mint when there are none. An acknowledged result spooled
// again for a redelivered command is sent again with its old ID below the
// watermark, and the control plane rightly finds it applied.

// minted records that seq was minted and is not spooled yet. Called with
// s.mu held, so a Through that reads nextEvent after it also sees seq.
func (s *State) minted(seq uint64) {
	s.ackMu.Lock()
	if s.minting == nil {
		s.minting = map[uint64]bool{}
	}
	s.minting[seq] = true
	s.ackMu.Unlock()
}

// abandon forgets a minted seq that will never be spooled (its write
// failed, or there was nothing new to say).
func (s *State) abandon(seq uint64) {
	s.ackMu.Lock()
	delete(s.minting, seq)
	s.ackMu.Unlock()
}

// Through is the watermark to send with a delivery: the ID at or below
// which nothing can be sent as new, or "" when that is nothing at all.
func (s *State) Through() string {
	s.mu.Lock()
	low, inc := s.nextEvent, s.incarnation
	s.mu.Unlock()
	s.ackMu.Lock()
	for seq := range s.owed {
		low = min(low, seq)
	}
	for seq := range s.minting {
		low = min(low, seq)
	}
	s.ackMu.Unlock()
	if low == 0 || inc == "" {
		return ""
	}
	return nodeproto.FormatEventID(inc, low-1)
}
