package nodeagent

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/internal/combiner"
	"github.com/mercator/mercator/nodeproto"
)

// The call answers stream (nodeproto.PathCallAnswers): whole answers to
// calls whose command allows it (InvokeCommand.AnswerStream) go as frames
// on one long request to the replica at the command's URL, instead of a
// POST each. A stream is opened on the first such call and is used only
// once the control plane answered its head; until then, and whenever it
// is broken, answers are posted as before. Frames of concurrent calls
// queued while one write is under way go together in the next, one TLS
// record for several answers. A stream idle for answersIdle is ended (the
// control plane takes one silent for callstream.Idle, 2 min, for dead), and
// opened again by the next call. The stream takes its connection whole
// when the replica agrees (nodeproto.CallAnswersUpgrade), else it rides a
// request's body and its answer.

const (
	// answersIdle ends a stream that carried nothing for that long
	// (agentFunctions.answersIdle in tests).
	answersIdle = 15 * time.Second
	// answersOpen bounds the wait for the stream's head.
	answersOpen = 5 * time.Second
	// answersRetry is how long after a stream could not be opened the
	// agent posts answers before it tries again.
	answersRetry = 30 * time.Second
	// answersOnBody is how long after a replica declined to take the
	// stream's connection (nodeproto.CallAnswersUpgrade) the agent opens
	// its streams to it on a request body without asking again: a replica
	// upgraded meanwhile is asked again after that.
	answersOnBody = 10 * time.Minute
)

var errAnswersOpen = errors.New("the control plane did not answer the call answers stream's head in time")

// answerStream is one call answers stream to one replica. Answers are
// written by the calls' own goroutines (package combiner): a hot call at
// c=1 hands its answer to no other goroutine of the agent, and concurrent
// calls share writes. The stream is broken (answers are posted) once
// frames is closed: ended, failed to open, or a write failed.
type answerStream struct {
	mu      sync.Mutex
	ready   bool          // the control plane answered the head
	retryAt time.Time     // when broken, when a new one may be opened
	opened  chan struct{} // closed once the head came back, or the open failed
	w       io.Writer     // where frames go: the connection, or the request body's pipe
	idle    time.Duration // answersIdle
	frames  *combiner.Writer
	last    time.Time // when a frame was last queued; guarded by frames' lock
}

// broken reports whether the stream carries no more answers.
func (st *answerStream) broken() bool {
	closed, _ := st.frames.Closed()
	return closed
}

// answerStreamFor is the stream to url, opening one when there is none
// (or the last broke and its retry time has come); nil while none is
// ready to carry frames.
func (f *agentFunctions) answerStreamFor(ctx context.Context, a *Agent, url string) *answerStream {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.answers[url]
	if st != nil {
		st.mu.Lock()
		ready, retryAt := st.ready, st.retryAt
		st.mu.Unlock()
		broken := st.broken()
		switch {
		case ready && !broken:
			return st
		case !broken || a.now().Before(retryAt):
			return nil // opening, or failed a moment ago
		}
	}
	if f.answers == nil {
		f.answers = map[string]*answerStream{}
	}
	st = &answerStream{opened: make(chan struct{}), idle: cmp.Or(f.answersIdle, answersIdle)}
	st.frames = combiner.New(func(p []byte) error {
		_, err := st.w.Write(p) // w is set before the stream is ready
		return err
	})
	f.answers[url] = st
	go f.runAnswerStream(ctx, a, url, st)
	return nil
}

// answerOnStream queues ans as a frame on the call answers stream to
// inv's replica when the command allows it and a stream is ready; false
// when the caller must post it instead.
func (f *agentFunctions) answerOnStream(ctx context.Context, a *Agent, inv nodeproto.InvokeCommand, ans nodeproto.CallAnswer) bool {
	if !inv.AnswerStream || !nodeproto.FramableHeader(ans.Header) {
		return false
	}
	st := f.answerStreamFor(ctx, a, inv.URL)
	if st == nil {
		return false
	}
	ans.Rendezvous = inv.Rendezvous
	return st.send(ans, a.now())
}

// send writes ans's frame on the stream, or queues it for the write under
// way; false when the stream is broken or the frame would be over
// nodeproto.MaxCallAnswerFrame (the caller posts the answer instead).
func (st *answerStream) send(ans nodeproto.CallAnswer, now time.Time) bool {
	return st.frames.Add(func(p []byte) ([]byte, bool) {
		start := len(p)
		p = nodeproto.AppendCallAnswer(p, ans)
		if len(p)-start > nodeproto.MaxCallAnswerFrame {
			return p[:start], false
		}
		st.last = now
		return p, true
	})
}

// fail marks the stream broken; a new one may be opened after retry.
func (st *answerStream) fail(now time.Time, retry time.Duration) {
	st.frames.Fail()
	st.mu.Lock()
	st.retryAt = now.Add(retry)
	st.mu.Unlock()
}

// runAnswerStream opens the stream to url and writes what is queued until
// it breaks or stays idle for answersIdle: on the connection itself when
// the replica takes it (nodeproto.CallAnswersUpgrade), which spares the
// HTTP client's goroutine that copies a request body to the connection,
// else on a request body.
func (f *agentFunctions) runAnswerStream(ctx context.Context, a *Agent, url string, st *answerStream) {
	f.mu.Lock()
	onBody := a.now().Before(f.answersOnBody[url])
	f.mu.Unlock()
	if !onBody {
		if !f.runAnswerConn(ctx, a, url, st) {
			return
		}
		a.logger.Debug("call answers stream: the control plane does not take the connection; streaming on a request body", "url", url)
		f.mu.Lock()
		if f.answersOnBody == nil {
			f.answersOnBody = map[string]time.Time{}
		}
		f.answersOnBody[url] = a.now().Add(answersOnBody)
		f.mu.Unlock()
	}
	f.runAnswerBody(ctx, a, url, st)
}

// answersRequest is the stream's request to url, body its body.
func answersRequest(ctx context.Context, a *Agent, url string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(url, "/")+nodeproto.PathCallAnswers, body)
	if err != nil {
		return nil, err
	}
	nodeID, tok := a.creds()
	req.Header.Set(nodeproto.HeaderNodeID, nodeID)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("User-Agent", "mercator-agent")
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set(nodeproto.HeaderCallInvokes, nodeproto.CallInvokesBinary)
	return req, nil
}

// runAnswerConn runs the stream on the connection itself. declined says
// the replica answered without taking it (one that predates it): the
// caller opens the stream on a body instead.
func (f *agentFunctions) runAnswerConn(ctx context.Context, a *Agent, url string, st *answerStream) (declined bool) {
	openCtx, cancelOpen := context.WithCancel(ctx)
	defer cancelOpen()
	req, err := answersRequest(openCtx, a, url, http.NoBody)
	if err != nil {
		st.openFailed(a.now())
		return false
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", nodeproto.CallAnswersUpgrade)
	giveUp := time.AfterFunc(answersOpen, cancelOpen)
	resp, err := f.client.Do(req)
	inTime := giveUp.Stop()
	if err == nil && resp.StatusCode != http.StatusSwitchingProtocols {
		if resp.StatusCode == http.StatusOK {
			// Its answer ends as soon as it read the empty body, and may
			// carry invokes until then: each is run.
			if resp.Header.Get(nodeproto.HeaderCallInvokes) == nodeproto.CallInvokesBinary {
				a.readInvokes(ctx, url, resp.Body)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return true
		}
		resp.Body.Close()
		a.logger.Debug("call answers stream refused; posting answers", "url", url, "status", resp.Status)
		err = fmt.Errorf("status %s", resp.Status)
	}
	var conn io.ReadWriteCloser
	if err == nil {
		var ok bool
		if conn, ok = resp.Body.(io.ReadWriteCloser); !ok || !inTime || resp.Header.Get(nodeproto.HeaderCallInvokes) != nodeproto.CallInvokesBinary {
			resp.Body.Close()
			err = errAnswersOpen
		}
	}
	if err != nil {
		a.logger.Debug("call answers stream", "url", url, "err", err)
		st.openFailed(a.now())
		return false
	}
	defer conn.Close()
	st.w = conn
	st.open(a.now())
	ended := make(chan struct{})
	go func() {
		a.readInvokes(ctx, url, conn)
		close(ended)
	}()
	st.carry(ctx, a, ended, func() {
		// The replica reads to the end frame, writes what it still had,
		// and closes its own side: the reader above reads up to that.
		// (No frame is written after: the frames are closed.)
		_, err := conn.Write(nodeproto.AppendCallAnswersEnd(nil))
		if cw, ok := conn.(interface{ CloseWrite() error }); err != nil || !ok || cw.CloseWrite() != nil {
			conn.Close()
		}
	}, func(error) { conn.Close() })
	return false
}

// runAnswerBody runs the stream on a request body, the replica's answer
// carrying the invokes.
func (f *agentFunctions) runAnswerBody(ctx context.Context, a *Agent, url string, st *answerStream) {
	pr, pw := io.Pipe()
	st.w = pw
	req, err := answersRequest(ctx, a, url, pr)
	if err != nil {
		st.openFailed(a.now())
		return
	}
	// A refusal (an older control plane's 404, a limit's 429) is written
	// only after the server tried to read the body, which never ends: the
	// head must come back within answersOpen, or the open is given up.
	giveUp := time.AfterFunc(answersOpen, func() { pw.CloseWithError(errAnswersOpen) })
	resp, err := f.client.Do(req)
	if giveUp.Stop() && err == nil && resp.StatusCode == http.StatusOK {
		// taken: fall through
	} else if err == nil && resp.StatusCode == http.StatusOK {
		resp.Body.Close() // given up at the very moment the head came
		err = errAnswersOpen
	}
	if err != nil || resp.StatusCode != http.StatusOK {
		if err == nil {
			a.logger.Debug("call answers stream refused; posting answers", "url", url, "status", resp.Status)
			resp.Body.Close()
		} else {
			a.logger.Debug("call answers stream", "url", url, "err", err)
		}
		st.openFailed(a.now())
		pr.CloseWithError(io.ErrClosedPipe)
		return
	}
	// The control plane ends its answer only when it stops reading; until
	// then the answer may carry invokes (nodeproto.HeaderCallInvokes),
	// whose answers may then ride this stream.
	st.open(a.now())
	ended := make(chan struct{})
	go func() {
		if resp.Header.Get(nodeproto.HeaderCallInvokes) == nodeproto.CallInvokesBinary {
			a.readInvokes(ctx, url, resp.Body)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		close(ended)
	}()
	st.carry(ctx, a, ended, func() { pw.Close() }, func(err error) {
		pr.CloseWithError(err) // a frame's write under way fails
		pw.CloseWithError(err) // and the request's body with it
	})
}

// openFailed marks a stream that could not be opened broken until
// answersRetry, and lets its waiters go.
func (st *answerStream) openFailed(now time.Time) {
	st.fail(now, answersRetry)
	close(st.opened)
}

// open makes the stream take frames: before its invokes are read, so the
// answers to the first of them ride it.
func (st *answerStream) open(now time.Time) {
	st.last = now // before any frame: the stream is not ready yet
	st.mu.Lock()
	st.ready = true
	st.mu.Unlock()
	close(st.opened)
}

// carry runs an open stream: it ends the stream (end) once it carried
// nothing for its idle time with no write under way, and returns once the
// replica ended its side (ended), after end or on its own, or ctx ended;
// abort then stops writes under way.
func (st *answerStream) carry(ctx context.Context, a *Agent, ended <-chan struct{}, end func(), abort func(error)) {
	idle := time.NewTimer(st.idle)
	defer idle.Stop()
	for {
		select {
		case <-idle.C:
		case <-ended:
			st.fail(a.now(), 0)
			abort(io.ErrClosedPipe)
			return
		case <-ctx.Done():
			st.fail(a.now(), 0)
			abort(ctx.Err())
			return
		}
		// Ended once quiet for answersIdle with no write under way,
		// atomically with the frames (none is taken after).
		var wait time.Duration
		if !st.frames.CloseIfIdle(func() bool {
			quiet := a.now().Sub(st.last)
			wait = st.idle - quiet
			return quiet >= st.idle
		}) {
			if wait <= 0 { // a write under way: look again later
				wait = st.idle
			}
			idle.Reset(wait)
			continue
		}
		end() // the next call opens another
		<-ended
		return
	}
}

// readInvokes runs the invoke frames a replica writes down a call answers
// stream's answer (nodeproto.HeaderCallInvokes) as the session's are run,
// until the answer ends or holds something else (logged: the stream is
// then only drained).
func (a *Agent) readInvokes(ctx context.Context, url string, body io.Reader) {
	scanner := bufio.NewScanner(body)
	scanner.Buffer(make([]byte, 16<<10), nodeproto.MaxInvokeFrame+16)
	scanner.Split(splitInvokes)
	for scanner.Scan() {
		cmd, err := nodeproto.DecodeInvokeFrame(scanner.Bytes())
		if err != nil {
			a.logger.Warn("call answers stream: malformed invoke", "url", url, "err", err)
			return
		}
		a.invoke(ctx, cmd)
	}
	if err := scanner.Err(); err != nil && ctx.Err() == nil {
		a.logger.Debug("call answers stream: invokes", "url", url, "err", err)
	}
}

// splitInvokes splits a call answers stream's answer into invoke frames;
// anything else is an error.
func splitInvokes(data []byte, atEOF bool) (int, []byte, error) {
	if len(data) == 0 {
		return 0, nil, nil
	}
	if data[0] != nodeproto.SessionBinaryMarker {
		return 0, nil, fmt.Errorf("%w: no marker", nodeproto.ErrInvokeFrame)
	}
	return splitSession(data, atEOF)
}
