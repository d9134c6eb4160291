package function

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/callkind"
	"github.com/mercator/mercator/controlplane/internal/callstream"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// Rendezvous.

// rendezvous is one attempt of one call on one node.
type rendezvous struct {
	id     string
	nodeID string
	cmd    nodeproto.InvokeCommand // the whole command
	body   io.Reader               // what GET …/request streams; nil when inline or empty

	taken   atomic.Bool // the agent began reading the body
	fetched atomic.Bool // the agent fetched the command
	// via, when the command went down a call answers stream rather than
	// the session, is closed if that stream broke (callstream.Invokes):
	// the command is then sent again down the session. Set by the Send
	// that sent it, in attempt's goroutine.
	via <-chan struct{}

	mu       sync.Mutex
	state    int // rvWaiting, rvAnswered, rvAbandoned
	ans      *callAnswer
	answered chan struct{}
	logs     chan string
}

const (
	rvWaiting = iota
	rvAnswered
	rvAbandoned
)

// callAnswer is the node's answer: an error before any response (kind),
// or a response whose body is being posted.
type callAnswer struct {
	kind, message string

	status int
	header http.Header
	// length is the body's length when the node sent it whole, else -1.
	length  int64
	body    io.Reader
	trailer func() http.Header
	// done is sent, exactly once, when the caller's side finished with
	// body: nil when it read it all, the error otherwise.
	done chan error
}

// deliver records the first answer; false if the attempt already has one
// or was abandoned.
func (rv *rendezvous) deliver(a *callAnswer) bool {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if rv.state != rvWaiting {
		return false
	}
	rv.state, rv.ans = rvAnswered, a
	close(rv.answered)
	return true
}

// abandon gives the attempt up; false when an answer arrived first, which
// the caller must then handle (a streamed answer waits for its done).
func (rv *rendezvous) abandon() bool {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if rv.state == rvAnswered {
		return false
	}
	rv.state = rvAbandoned
	return true
}

// lookupRendezvous finds a rendezvous for the calling node.
func (s *Service) lookupRendezvous(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) *rendezvous {
	v, ok := s.rvs.Load(r.PathValue("id"))
	if !ok {
		writeFnJSON(w, http.StatusGone, api.ErrorOf(failure.NotFound("call attempt", r.PathValue("id"))))
		return nil
	}
	rv := v.(*rendezvous)
	if rv.nodeID != c.NodeID {
		httpapi.WriteError(w, failure.Conflict("call attempt %s is not on node %s", rv.id, c.NodeID))
		return nil
	}
	return rv
}

// callCommand answers an agent that received a reference with the whole
// command.
func (s *Service) callCommand(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	rv := s.lookupRendezvous(w, r, c)
	if rv == nil {
		return
	}
	rv.fetched.Store(true)
	writeFnJSON(w, http.StatusOK, rv.cmd)
}

// callRequestBody streams the caller's request body to the agent, once.
func (s *Service) callRequestBody(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	rv := s.lookupRendezvous(w, r, c)
	if rv == nil {
		return
	}
	rv.fetched.Store(true)
	if !rv.taken.CompareAndSwap(false, true) {
		httpapi.WriteError(w, failure.Conflict("the request body of call attempt %s was already taken", rv.id))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	if rv.body == nil {
		return
	}
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := rv.body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			// The caller's body broke: the agent must see a broken body,
			// not a complete one.
			panic(http.ErrAbortHandler)
		}
	}
}

// callResponse takes the node's answer: an error, or a response whose
// body is relayed to the caller while this request is open.
func (s *Service) callResponse(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	rv := s.lookupRendezvous(w, r, c)
	if rv == nil {
		return
	}
	rv.fetched.Store(true)
	if kind := r.Header.Get(nodeproto.HeaderCallError); kind != "" {
		msg, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if !rv.deliver(&callAnswer{kind: kind, message: string(msg)}) {
			writeFnJSON(w, http.StatusGone, api.ErrorOf(failure.Conflict("call attempt %s is over", rv.id)))
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	status, err := strconv.Atoi(r.Header.Get(nodeproto.HeaderCallStatus))
	if err != nil || status < 100 || status > 999 {
		httpapi.WriteError(w, failure.Invalid(nodeproto.HeaderCallStatus, "%q is not an HTTP status", r.Header.Get(nodeproto.HeaderCallStatus)))
		return
	}
	if status < 200 {
		if !rv.deliver(interimAnswer(status)) {
			writeFnJSON(w, http.StatusGone, api.ErrorOf(failure.Conflict("call attempt %s is over", rv.id)))
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	header := http.Header{}
	for k, vs := range r.Header {
		if name, ok := strings.CutPrefix(k, nodeproto.HeaderCallHeader); ok && name != "" {
			header[http.CanonicalHeaderKey(name)] = vs
		}
	}
	a := &callAnswer{status: status, header: header, length: r.ContentLength, body: r.Body,
		trailer: func() http.Header { return r.Trailer }, done: make(chan error, 1)}
	if !rv.deliver(a) {
		writeFnJSON(w, http.StatusGone, api.ErrorOf(failure.Conflict("call attempt %s is over", rv.id)))
		return
	}
	if err := <-a.done; err != nil {
		// Close the connection rather than answer, so the agent's next
		// write fails and the node stops the call.
		panic(http.ErrAbortHandler)
	}
	w.WriteHeader(http.StatusOK)
}

// callLog takes a durable call's output.
func (s *Service) callLog(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	rv := s.lookupRendezvous(w, r, c)
	if rv == nil {
		return
	}
	text, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	select {
	case rv.logs <- string(text):
	default:
	}
	w.WriteHeader(http.StatusOK)
}

// interimAnswer is the answer to a call whose function answered an
// informational status (1xx): no final response, as Fn's contract has it
// (an agent that predates its check passes one on). Written as it is, it
// would reach the caller as an interim response followed by a 200 the
// function never chose.
func interimAnswer(status int) *callAnswer {
	return &callAnswer{kind: callkind.InvalidResponse, message: fmt.Sprintf("the function answered status %d, not a final HTTP status", status)}
}

// callAnswers takes a node's call answers stream (package callstream):
// each frame is delivered to its rendezvous as a POST to …/response
// would be; one for a rendezvous that is unknown, over, or another
// node's is dropped, as a late POST is answered 410.
func (s *Service) callAnswers(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	callstream.Serve(w, r, s.log, c.NodeID, func(f nodeproto.CallAnswer) {
		v, ok := s.rvs.Load(f.Rendezvous)
		if !ok || v.(*rendezvous).nodeID != c.NodeID {
			return
		}
		rv := v.(*rendezvous)
		rv.fetched.Store(true)
		a := &callAnswer{kind: f.ErrorKind, message: f.ErrorMessage}
		if f.ErrorKind == "" && f.Status < 200 {
			a = interimAnswer(f.Status)
		} else if f.ErrorKind == "" { // the agent's engine names headers canonically, as a POST's would be
			a = &callAnswer{status: f.Status, header: f.Header, length: int64(len(f.Body)), body: bytes.NewReader(f.Body),
				trailer: http.Header(nil).Clone, done: make(chan error, 1)}
		}
		rv.deliver(a)
	}, func(iv *callstream.Invokes) func() {
		return s.host.AttachInvokes(c.NodeID, c.Session.FencingToken, func(fencing uint64, cmd *nodeproto.InvokeCommand) bool {
			// Only this replica's own attempts, which can send again
			// if the stream breaks (attempt); another replica's goes
			// down the session.
			v, ok := s.rvs.Load(cmd.Rendezvous)
			if !ok || v.(*rendezvous).nodeID != c.NodeID || !iv.Send(fencing, cmd) {
				return false
			}
			v.(*rendezvous).via = iv.Broken()
			return true
		})
	})
}
