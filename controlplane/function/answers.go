package function

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net/http"

	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/nodeproto"
)

// The call answers stream (nodeproto.PathCallAnswers): an agent's whole
// answers to this replica's rendezvous, as frames on one long request,
// in place of a POST to …/response per call. The head is answered at
// once, so the agent knows the stream is taken before it sends on it;
// then every frame is delivered to its rendezvous as a POST's answer
// would be. A frame carries a whole answer (the agent holds one until
// it is whole), so delivering it never waits on the caller: a slow
// caller holds up no other call's answer.

// callAnswers reads a node's call answers stream until it ends.
func (s *Service) callAnswers(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	rc := http.NewResponseController(w)
	// The head goes out while the body is still to be read.
	_ = rc.EnableFullDuplex()
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	// A stream ends with its agent (the body's end) or with this
	// replica's shutdown (the request's context).
	stop := context.AfterFunc(r.Context(), func() { r.Body.Close() })
	defer stop()
	br := bufio.NewReaderSize(r.Body, 64<<10)
	var buf []byte
	for {
		var a nodeproto.CallAnswer
		var err error
		a, buf, err = nodeproto.ReadCallAnswer(br, buf)
		if err != nil {
			if errors.Is(err, nodeproto.ErrCallAnswerFrame) {
				s.log.Warn("call answers stream: malformed frame; closing the stream", "node", c.NodeID, "err", err)
			}
			return
		}
		s.deliverFrame(c.NodeID, a)
	}
}

// deliverFrame delivers one frame's answer to its rendezvous, if the
// rendezvous is waiting on this node; a late or stray one is dropped, as
// a late POST is answered 410. The body is copied out of the stream's
// buffer, which the next frame reuses.
func (s *Service) deliverFrame(nodeID string, f nodeproto.CallAnswer) {
	v, ok := s.rvs.Load(f.Rendezvous)
	if !ok {
		return
	}
	rv := v.(*rendezvous)
	if rv.nodeID != nodeID {
		s.log.Warn("call answers stream: a frame for another node's call attempt", "node", nodeID, "rendezvous", f.Rendezvous)
		return
	}
	rv.fetched.Store(true)
	if f.ErrorKind != "" {
		rv.deliver(&callAnswer{kind: f.ErrorKind, message: f.ErrorMessage})
		return
	}
	header := make(http.Header, len(f.Header))
	for k, vs := range f.Header {
		ck := http.CanonicalHeaderKey(k)
		header[ck] = append(header[ck], vs...)
	}
	rv.deliver(&callAnswer{status: f.Status, header: header, length: int64(len(f.Body)),
		body: bytes.NewReader(bytes.Clone(f.Body)), trailer: noTrailer, done: make(chan error, 1)})
}

func noTrailer() http.Header { return nil }
