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
	"net"
	"net/http"
	"strings"
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
	invokes := attach != nil && r.Header.Get(nodeproto.HeaderCallInvokes) == nodeproto.CallInvokesBinary
	if invokes && upgradeAsked(r.Header) {
		// The connection itself, when it can be had (HTTP/1.1); otherwise
		// the answer below, whose empty body ends at once, tells the agent
		// to open the stream on a request body instead.
		if conn, brw, err := http.NewResponseController(w).Hijack(); err == nil {
			serveConn(r.Context(), conn, brw, log, node, deliver, attach)
			return
		}
	}
	rc := http.NewResponseController(w)
	// The head goes out while the body is still to be read.
	_ = rc.EnableFullDuplex()
	if invokes {
		w.Header().Set(nodeproto.HeaderCallInvokes, nodeproto.CallInvokesBinary)
	}
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	var iv *Invokes
	if invokes {
		iv = newInvokes(func(p []byte) error {
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			_, err := w.Write(p)
			if err == nil {
				err = rc.Flush()
			}
			return err
		})
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
	err := read(idleReader{r.Context(), r.Body, rc.SetReadDeadline}, log, node, deliver)
	if iv != nil && !errors.Is(err, io.EOF) && !errors.Is(err, nodeproto.ErrCallAnswersEnd) {
		// Not the agent's end: what was written down may be unread.
		iv.fail()
	}
}

// upgradeAsked reports whether the request asks for the connection
// (nodeproto.CallAnswersUpgrade).
func upgradeAsked(h http.Header) bool {
	return h.Get("Upgrade") == nodeproto.CallAnswersUpgrade && hasToken(h["Connection"], "Upgrade")
}

// hasToken reports whether the comma-separated header values hold token
// (case-insensitively).
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// serveConn serves the stream on the connection the request came on,
// taken whole (nodeproto.CallAnswersUpgrade): the same frames as on the
// request's body and the answer's, without the chunks, each write the
// caller's own straight onto the connection.
func serveConn(ctx context.Context, conn net.Conn, brw *bufio.ReadWriter, log *slog.Logger, node string, deliver func(nodeproto.CallAnswer), attach func(*Invokes) (detach func())) {
	defer conn.Close()
	// The server's deadlines were the request head's; from here the
	// stream sets its own.
	_ = conn.SetDeadline(time.Time{})
	_ = conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + nodeproto.CallAnswersUpgrade +
		"\r\n" + nodeproto.HeaderCallInvokes + ": " + nodeproto.CallInvokesBinary + "\r\n\r\n")
	if brw.Flush() != nil {
		return
	}
	iv := newInvokes(func(p []byte) error {
		_ = conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, err := conn.Write(p)
		return err
	})
	detach := attach(iv)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer stop()
	err := read(idleReader{ctx, brw.Reader, conn.SetReadDeadline}, log, node, deliver)
	// Only the end frame is the agent's end: the connection's end alone
	// may be a cut.
	clean := errors.Is(err, nodeproto.ErrCallAnswersEnd)
	if !clean {
		iv.fail()
	}
	iv.close() // and so nothing is written after
	detach()
	if clean {
		// Close this side after every invoke frame written, which the
		// agent reads up to this end, then wait for the agent's own
		// close: closing with its end unread would reset the connection,
		// and could take those frames with it.
		if cw, ok := conn.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			_ = conn.SetReadDeadline(time.Now().Add(closeWait))
			_, _ = io.Copy(io.Discard, brw.Reader)
		}
	}
}

// closeWait bounds the wait for an agent's close after its end frame.
const closeWait = 5 * time.Second

// read reads answer frames from body until it ends, calling deliver with
// each; io.EOF (on a body) and nodeproto.ErrCallAnswersEnd are the
// agent's own end of the stream.
func read(body io.Reader, log *slog.Logger, node string, deliver func(nodeproto.CallAnswer)) error {
	br := bufio.NewReaderSize(body, 64<<10)
	var buf []byte
	for {
		var a nodeproto.CallAnswer
		var err error
		a, buf, err = nodeproto.ReadCallAnswer(br, buf)
		if err != nil {
			if errors.Is(err, nodeproto.ErrCallAnswerFrame) {
				log.Warn("call answers stream: malformed frame; closing the stream", "node", node, "err", err)
			}
			return err
		}
		a.Body = bytes.Clone(a.Body)
		deliver(a)
	}
}

// Idle is how long a call answers stream may carry nothing before it is
// ended: well past the agent's own idle end of it.
const Idle = 2 * time.Minute

// idleReader reads the stream under a read deadline of Idle from each
// read (set through setDeadline, the connection's), until ctx (the
// request's) ends.
type idleReader struct {
	ctx         context.Context
	r           io.Reader
	setDeadline func(time.Time) error
}

func (r idleReader) Read(p []byte) (int, error) {
	_ = r.setDeadline(time.Now().Add(Idle))
	// Checked after the deadline is set: a shutdown's past deadline set
	// before it was just replaced, and one set after it ends the read.
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}
