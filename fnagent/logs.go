package fnagent

import (
	"bytes"
	"fmt"
	"io"
	"sync"
)

// CallLog is what a container wrote to stdout and stderr during one call,
// interleaved in arrival order.
type CallLog struct {
	Data []byte
	// Truncated is true when the call wrote more than Config.MaxLogBytes and
	// the rest was dropped.
	Truncated bool
}

// logStore keeps the logs of the most recent calls, bounded in count and in
// bytes per call.
type logStore struct {
	mu       sync.Mutex
	maxBytes int
	keep     int
	byID     map[string]*callLog
	order    []string // oldest first
}

func newLogStore(maxBytes, keep int) *logStore {
	return &logStore{maxBytes: maxBytes, keep: keep, byID: map[string]*callLog{}}
}

// open returns the log of callID, creating it (and forgetting the oldest
// log beyond keep).
func (s *logStore) open(callID string) *callLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.byID[callID]; l != nil {
		return l
	}
	l := &callLog{max: s.maxBytes}
	s.byID[callID] = l
	s.order = append(s.order, callID)
	for len(s.order) > s.keep {
		delete(s.byID, s.order[0])
		s.order = s.order[1:]
	}
	return l
}

// lookup returns the log of callID or nil.
func (s *logStore) lookup(callID string) *callLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[callID]
}

func (s *logStore) get(callID string) (CallLog, bool) {
	l := s.lookup(callID)
	if l == nil {
		return CallLog{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return CallLog{Data: bytes.Clone(l.buf), Truncated: l.truncated}, true
}

// callLog is one call's bounded log.
type callLog struct {
	mu        sync.Mutex
	max       int
	buf       []byte
	truncated bool
}

func (l *callLog) write(p []byte) {
	if l == nil || len(p) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	room := l.max - len(l.buf)
	if len(p) > room {
		p = p[:max(room, 0)]
		l.truncated = true
	}
	l.buf = append(l.buf, p...)
}

// tailSize is how much of a container's output is kept for error messages.
const tailSize = 2048

// logSink receives one container's output and attributes it to calls.
//
// Attribution uses the FDK's own framing where the function provides it:
// at the start of each call an FDK prints "\n<FN_LOGFRAME_NAME>=<call ID>\n"
// to stdout and to stderr, so what follows on that stream is that call's,
// even if it arrives after the engine has moved on to the next call. A
// stream that has never shown a frame (a function without an FDK) is
// attributed to the call the engine dispatched last, so output a call
// writes after its response ends still counts as its own until the next
// call starts. Frame lines, and the blank line an FDK puts before one, are
// not part of any log.
type logSink struct {
	mu      sync.Mutex
	store   *logStore
	prefix  []byte // "<name>="
	current *callLog
	streams [2]frameState
	tail    []byte
}

// frameState is the framing parser of one stream.
type frameState struct {
	framed      bool     // a frame has been seen on this stream
	target      *callLog // the framed call
	pending     []byte   // the start of a line that may be a frame
	passthrough bool     // the current line is known not to be a frame
	heldEmpty   bool     // an empty line held in case a frame follows
}

// maxFrameLine bounds a frame line; longer lines are output.
const maxFrameLine = 256

func newLogSink(store *logStore) *logSink {
	return &logSink{store: store, prefix: []byte(logFrameName + "=")}
}

// setCall makes l the call unframed output is attributed to.
func (s *logSink) setCall(l *callLog) {
	s.mu.Lock()
	s.current = l
	s.mu.Unlock()
}

// Tail is the end of everything the container wrote.
func (s *logSink) Tail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.tail)
}

// writer returns the writer of stream 0 (stdout) or 1 (stderr).
func (s *logSink) writer(stream int) io.Writer { return sinkWriter{s, stream} }

type sinkWriter struct {
	s      *logSink
	stream int
}

func (w sinkWriter) Write(p []byte) (int, error) {
	w.s.write(w.stream, p)
	return len(p), nil
}

func (s *logSink) write(stream int, p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The tail keeps its array (a framed call writes twice, and a fresh
	// copy per write was garbage at every call) unless a large write grew
	// it.
	s.tail = append(s.tail, p...)
	if len(s.tail) > tailSize {
		keep := s.tail[len(s.tail)-tailSize:]
		if cap(s.tail) > 4*tailSize {
			s.tail = append(make([]byte, 0, 2*tailSize), keep...)
		} else {
			s.tail = s.tail[:copy(s.tail, keep)]
		}
	}
	st := &s.streams[stream]
	emit := func(b []byte) {
		if st.framed {
			st.target.write(b)
		} else {
			s.current.write(b)
		}
	}
	flushHeld := func() {
		if st.heldEmpty {
			emit([]byte("\n"))
			st.heldEmpty = false
		}
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		seg, nl := p, false
		if i >= 0 {
			seg, nl = p[:i], true
			p = p[i+1:]
		} else {
			p = nil
		}
		if st.passthrough {
			emit(seg)
			if nl {
				emit([]byte("\n"))
				st.passthrough = false
			}
			continue
		}
		line := append(st.pending, seg...)
		st.pending = nil
		switch {
		case nl && len(line) == 0:
			flushHeld()
			st.heldEmpty = true
		case nl && s.isFrame(line):
			st.heldEmpty = false
			st.framed = true
			st.target = s.store.lookup(string(line[len(s.prefix):]))
		case nl:
			flushHeld()
			emit(line)
			emit([]byte("\n"))
		case s.mayBeFrame(line):
			st.pending = bytes.Clone(line)
		default:
			flushHeld()
			emit(line)
			st.passthrough = true
		}
	}
}

// isFrame reports whether a complete line is a frame.
func (s *logSink) isFrame(line []byte) bool {
	return len(line) > len(s.prefix) && len(line) <= maxFrameLine && bytes.HasPrefix(line, s.prefix) &&
		!bytes.ContainsAny(line[len(s.prefix):], " \t\r=")
}

// mayBeFrame reports whether an incomplete line could still become a frame.
func (s *logSink) mayBeFrame(line []byte) bool {
	if len(line) <= len(s.prefix) {
		return bytes.HasPrefix(s.prefix, line)
	}
	return len(line) < maxFrameLine && bytes.HasPrefix(line, s.prefix)
}

func (l CallLog) String() string {
	if l.Truncated {
		return fmt.Sprintf("%s[truncated]", l.Data)
	}
	return string(l.Data)
}
