package controlplane

import (
	"encoding/json"
	"io"
	"net/http"
	"sync"

	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/node"
)

// Live sessions: the session streams this replica holds, down which
// ephemeral commands (a function call's invoke, a call_log question) are
// handed directly, without the store. Operations, which must survive a
// restart, go through the store and the mailbox instead (nodes_mailbox.go).

// liveSession is a node's session stream held by this replica.
type liveSession struct {
	nodeID  string
	fencing uint64
	// cmds holds pointers: a slot per queued call costs a word, not a
	// command (a thousand slots of node.Command were 60 KB a session, the
	// largest part of a replica's memory at ten thousand nodes).
	cmds chan *node.Command
	done chan struct{}
}

// liveSessions is the latest session of each node held here. The zero
// value is ready; safe for concurrent use.
type liveSessions struct {
	mu       sync.Mutex
	sessions map[string]*liveSession // by node ID, the latest only
}

// attach registers a session stream that is about to start. It reads the
// session request's (empty) body to its end first: only then does the
// HTTP server watch the connection and cancel the request's context the
// moment the agent goes away, rather than when the next keep-alive fails
// to write, and a call in flight on a dead node must fail promptly.
func (l *liveSessions) attach(nodeID string, fencing uint64, r *http.Request) *liveSession {
	io.Copy(io.Discard, io.LimitReader(r.Body, httpapi.MaxBody))
	ls := &liveSession{nodeID: nodeID, fencing: fencing, cmds: make(chan *node.Command, 1024), done: make(chan struct{})}
	l.mu.Lock()
	if l.sessions == nil {
		l.sessions = map[string]*liveSession{}
	}
	l.sessions[nodeID] = ls
	l.mu.Unlock()
	return ls
}

// detach unregisters a session whose stream ended; calls sent on it and
// not answered yet end as node_lost (their lost channel closes).
func (l *liveSessions) detach(ls *liveSession) {
	l.mu.Lock()
	if l.sessions[ls.nodeID] == ls {
		delete(l.sessions, ls.nodeID)
	}
	l.mu.Unlock()
	close(ls.done)
}

// get is the node's session held here, or nil.
func (l *liveSessions) get(nodeID string) *liveSession {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sessions[nodeID]
}

// send hands cmd to the node's session held here, under the session's
// fencing token. held is false when none is held; sent is false when it is
// backed up. lost closes when the session ends.
func (l *liveSessions) send(nodeID string, cmd node.Command) (lost <-chan struct{}, held, sent bool) {
	ls := l.get(nodeID)
	if ls == nil {
		return nil, false, false
	}
	cmd.FencingToken = ls.fencing
	select {
	case ls.cmds <- &cmd:
		return ls.done, true, true
	default:
		return ls.done, true, false
	}
}

// forward writes cmd to the session stream, with every other command
// already queued, and flushes once.
func (ls *liveSession) forward(enc *json.Encoder, f http.Flusher, cmd *node.Command) error {
	for {
		if err := enc.Encode(cmd); err != nil {
			return err
		}
		select {
		case cmd = <-ls.cmds:
		default:
			f.Flush()
			return nil
		}
	}
}
