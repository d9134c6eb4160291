// Package callstream serves a node's call answers stream
// (nodeproto.PathCallAnswers): whole function answers, as binary frames on
// one long request, in place of a POST to a call's …/response each. It
// answers the request's head at once, so the agent knows the stream is
// taken before it sends on it, then reads frames until the body ends (or
// the server shuts down) and hands each to the caller's deliver, which
// meets it with its rendezvous (package controlplane/function). A frame
// carries a whole answer (the agent holds one until it is whole), so
// delivering it never waits on a caller: a slow caller holds up no other
// call's answer. Only package controlplane/function uses it; it is apart
// to keep that package within its size.
package callstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// Serve reads node's call answers stream from r until it ends, calling
// deliver with each frame's answer. The answer's Body is the answer's own
// (not the stream's buffer, which the next frame reuses). A malformed
// frame ends the stream (the agent posts its next answers until it opens
// another), with a warning naming the node.
//
// When the agent asks for invokes down the answer
// (nodeproto.HeaderCallInvokes) and attach is not nil, the answer's head
// says they may come, and attach is handed the stream's Invokes once the
// head is out; the detach it returns is called when the stream ends, after
// which the Invokes takes nothing more.
func Serve(w http.ResponseWriter, r *http.Request, log *slog.Logger, node string, deliver func(nodeproto.CallAnswer), attach func(*Invokes) (detach func())) {
	rc := http.NewResponseController(w)
	// The head goes out while the body is still to be read.
	_ = rc.EnableFullDuplex()
	invokes := attach != nil && r.Header.Get(nodeproto.HeaderCallInvokes) == nodeproto.CallInvokesBinary
	if invokes {
		w.Header().Set(nodeproto.HeaderCallInvokes, nodeproto.CallInvokesBinary)
	}
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	var iv *Invokes
	if invokes {
		iv = newInvokes(w, rc)
		detach := attach(iv)
		defer func() {
			iv.close()
			detach()
		}()
	}
	// A stream ends with its agent (the body's end) or with this
	// replica's shutdown (the request's context): a read deadline in the
	// past ends the read under way. (Closing the body would not: the
	// server's body waits for the read under way to return, which an
	// idle stream's does only after Idle, and meanwhile the replica's
	// shutdown waits for this handler, and the agent, seeing the stream
	// up, keeps sending answers to a replica that is going away.)
	stop := context.AfterFunc(r.Context(), func() { _ = rc.SetReadDeadline(time.Now()) })
	defer stop()
	// Idle streams are the agent's to end (after 15 s); one silent for
	// Idle is taken for dead, whatever the server's ReadTimeout, which
	// bounded the request's head.
	br := bufio.NewReaderSize(idleReader{r.Context(), r.Body, rc}, 64<<10)
	var buf []byte
	for {
		var a nodeproto.CallAnswer
		var err error
		a, buf, err = nodeproto.ReadCallAnswer(br, buf)
		if err != nil {
			if errors.Is(err, nodeproto.ErrCallAnswerFrame) {
				log.Warn("call answers stream: malformed frame; closing the stream", "node", node, "err", err)
			}
			if iv != nil && !errors.Is(err, io.EOF) {
				// Not the agent's end: what was written down may be unread.
				iv.fail()
			}
			return
		}
		a.Body = bytes.Clone(a.Body)
		deliver(a)
	}
}

// Idle is how long a call answers stream may carry nothing before it is
// ended: well past the agent's own idle end of it.
const Idle = 2 * time.Minute

// idleReader reads the stream's body under a deadline of Idle from each
// read, until ctx (the request's) ends.
type idleReader struct {
	ctx  context.Context
	body io.Reader
	rc   *http.ResponseController
}

func (r idleReader) Read(p []byte) (int, error) {
	_ = r.rc.SetReadDeadline(time.Now().Add(Idle))
	// Checked after the deadline is set: a shutdown's past deadline set
	// before it was just replaced, and one set after it ends the read.
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.body.Read(p)
}
