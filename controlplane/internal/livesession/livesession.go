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
	// cmds holds pointers: a slot per queued call costs a word, not a
	// command (a thousand slots of nodeproto.Command were 60 KB a session, the
	// largest part of a replica's memory at ten thousand nodes).
	// Commands is what the stream sends besides operations.
	Commands chan *nodeproto.Command
	done     chan struct{}
	// binary: the agent reads invokes as binary frames
	// (nodeproto.HeaderSessionBinary, nodeproto/invokebin.go).
	binary bool
	frame  []byte // reused for them
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
	ls := &Session{nodeID: nodeID, fencing: fencing, Commands: make(chan *nodeproto.Command, 1024), done: make(chan struct{}),
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
	select {
	case ls.Commands <- &cmd:
		return ls.done, true, true
	default:
		return ls.done, true, false
	}
}

// Forward writes cmd to the session stream w, with every other command
// already queued, and flushes once. Invokes go as binary frames to an
// agent that reads them, as JSON (enc, which writes to w) otherwise.
func (ls *Session) Forward(w io.Writer, enc *json.Encoder, f http.Flusher, cmd *nodeproto.Command) error {
	for {
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
		select {
		case cmd = <-ls.Commands:
		default:
			f.Flush()
			return nil
		}
	}
}
