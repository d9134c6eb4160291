// Package livesession is the registry of node session streams one
// control-plane replica holds, down which ephemeral commands (a function
// call's invoke, a call_log question) are handed directly, without the
// store. Operations, which must survive a restart, go through the store
// and the mailbox instead (package controlplane). Only package
// controlplane may import it.
package livesession

import (
	"encoding/json"
	"io"
	"net/http"
	"sync"

	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/nodeproto"
)

// Session is a node's session stream held by this replica.
type Session struct {
	nodeID  string
	fencing uint64
	// queued is what the stream sends besides operations, at most
	// MaxQueued; ready has a token while it is not empty. A slice that
	// grows with what is queued, not a channel with a slot for every
	// command that might be: a channel of 1,024 pointers was 8 KiB a
	// session whatever it held, 80 MB at ten thousand nodes and 400 MB at
	// fifty thousand, and the collector scanned all of it every cycle.
	mu     sync.Mutex
	queued []*nodeproto.Command
	ready  chan struct{}
	done   chan struct{}
	// binary: the agent reads invokes as binary frames
	// (nodeproto.HeaderSessionBinary, nodeproto/invokebin.go).
	binary bool
	frame  []byte // reused for them
	spare  []*nodeproto.Command
}

// MaxQueued is the most commands a session holds unsent: past it Send
// reports the node backed up, and the call goes elsewhere or fails busy.
const MaxQueued = 1024

// Ready has a value while commands are queued for the stream: the stream's
// loop selects on it, then calls Forward.
func (ls *Session) Ready() <-chan struct{} { return ls.ready }

// enqueue queues cmd unless MaxQueued are queued.
func (ls *Session) enqueue(cmd *nodeproto.Command) bool {
	ls.mu.Lock()
	if len(ls.queued) >= MaxQueued {
		ls.mu.Unlock()
		return false
	}
	ls.queued = append(ls.queued, cmd)
	ls.mu.Unlock()
	select {
	case ls.ready <- struct{}{}:
	default:
	}
	return true
}

// take returns what is queued, in order, leaving the queue empty; the
// slice is the session's until the next take.
func (ls *Session) take() []*nodeproto.Command {
	clear(ls.spare) // the commands sent last time, let go
	ls.mu.Lock()
	out := ls.queued
	ls.queued = ls.spare[:0]
	ls.mu.Unlock()
	ls.spare = out
	return out
}

// Registry is the latest session of each node held here. The zero value
// is ready; safe for concurrent use.
type Registry struct {
	mu       sync.Mutex
	sessions map[string]*Session // by node ID, the latest only
	invokes  map[string]*route   // by node ID, the latest only
}

// route is a way for invokes to reach a node other than its session
// stream (AttachInvokes).
type route struct {
	fencing uint64
	send    func(fencing uint64, cmd *nodeproto.InvokeCommand) bool
}

// AttachInvokes makes send the way invoke commands reach nodeID while this
// replica holds its session under the same fencing token (the enrollment
// the stream behind send was opened under: a superseded agent's stream is
// never used) and send takes them, in place of the session stream; the
// latest attached wins. send writes the command under the fencing token,
// or reports false (closed), and the command goes down the session
// instead. detach undoes this attachment (not a later one's).
func (l *Registry) AttachInvokes(nodeID string, fencing uint64, send func(fencing uint64, cmd *nodeproto.InvokeCommand) bool) (detach func()) {
	rt := &route{fencing: fencing, send: send}
	l.mu.Lock()
	if l.invokes == nil {
		l.invokes = map[string]*route{}
	}
	l.invokes[nodeID] = rt
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		if l.invokes[nodeID] == rt {
			delete(l.invokes, nodeID)
		}
		l.mu.Unlock()
	}
}

// Attach registers a session stream that is about to start. It reads the
// session request's (empty) body to its end first: only then does the
// HTTP server watch the connection and cancel the request's context the
// moment the agent goes away, rather than when the next keep-alive fails
// to write, and a call in flight on a dead node must fail promptly.
func (l *Registry) Attach(nodeID string, fencing uint64, r *http.Request) *Session {
	io.Copy(io.Discard, io.LimitReader(r.Body, httpapi.MaxBody))
	ls := &Session{nodeID: nodeID, fencing: fencing, ready: make(chan struct{}, 1), done: make(chan struct{}),
		binary: r.Header.Get(nodeproto.HeaderSessionBinary) == nodeproto.SessionBinaryInvoke}
	l.mu.Lock()
	if l.sessions == nil {
		l.sessions = map[string]*Session{}
	}
	l.sessions[nodeID] = ls
	l.mu.Unlock()
	return ls
}

// Detach unregisters a session whose stream ended; calls sent on it and
// not answered yet end as node_lost (their lost channel closes).
func (l *Registry) Detach(ls *Session) {
	l.mu.Lock()
	if l.sessions[ls.nodeID] == ls {
		delete(l.sessions, ls.nodeID)
	}
	l.mu.Unlock()
	close(ls.done)
}

// Get is the node's session held here, or nil.
func (l *Registry) Get(nodeID string) *Session {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sessions[nodeID]
}

// Send hands cmd to the node's session held here, under the session's
// fencing token. held is false when none is held; sent is false when it is
// backed up. lost closes when the session ends.
func (l *Registry) Send(nodeID string, cmd nodeproto.Command) (lost <-chan struct{}, held, sent bool) {
	l.mu.Lock()
	ls, rt := l.sessions[nodeID], l.invokes[nodeID]
	l.mu.Unlock()
	if ls == nil {
		return nil, false, false
	}
	cmd.FencingToken = ls.fencing
	if rt != nil && rt.fencing == ls.fencing && cmd.Kind == nodeproto.KindInvoke && cmd.Invoke != nil && rt.send(ls.fencing, cmd.Invoke) {
		return ls.done, true, true
	}
	return ls.done, true, ls.enqueue(&cmd)
}

// Forward writes every command queued to the session stream w, taking
// more as they come while it writes, and flushes once. Invokes go as
// binary frames to an agent that reads them, as JSON (enc, which writes to
// w) otherwise. Only the stream's own goroutine calls it.
func (ls *Session) Forward(w io.Writer, enc *json.Encoder, f http.Flusher) error {
	for {
		cmds := ls.take()
		if len(cmds) == 0 {
			f.Flush()
			return nil
		}
		for _, cmd := range cmds {
			var err error
			if ls.binary && cmd.Kind == nodeproto.KindInvoke && cmd.Invoke != nil {
				ls.frame = nodeproto.AppendInvokeFrame(ls.frame[:0], cmd.FencingToken, cmd.Invoke)
				_, err = w.Write(ls.frame)
			} else {
				err = enc.Encode(cmd)
			}
			if err != nil {
				return err
			}
		}
	}
}
