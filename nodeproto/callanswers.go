package nodeproto

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The call answers stream: whole function answers on one long request.
//
// A hot call's answer is nearly always small and quick: the agent holds it
// until it is whole (nodeagent's coalescing) and then posted it as a
// request of its own to PathCalls+ID+"/response", which cost a request's
// head, the node's authentication, routing, and an answer, each way over
// TLS, for every call. Instead the agent may keep one request open to the
// replica at InvokeCommand.URL, POST PathCallAnswers, whose body is a
// stream of frames (AppendCallAnswer), each a whole answer to one
// rendezvous: its status, headers and body, or the error it ended with
// before any response. Answers of concurrent calls written together share
// one write, and so one TLS record.
//
// The control plane answers the request's head (200) at once and reads
// frames until the body ends; the agent uses the stream only once that
// head arrived, and only for commands with AnswerStream set, which a
// control plane sets only when it serves this path (a control plane that
// predates it never sets it, and an agent that predates it ignores the
// field and posts, so neither side needs a capability version). A
// response that is streamed (slow or large), and a durable call's log,
// still go as requests of their own: a frame is never a part of an
// answer, so a slow caller can hold up no other call's answer.
//
// A frame whose rendezvous is unknown, over, or another node's is
// dropped, as a late POST is answered 410. A frame lost with its
// connection is as an answer whose POST broke: the control plane's wait
// for it ends at the call's deadline, or at once when the node's session
// ends.

// PathCallAnswers is the call answers stream's path.
const PathCallAnswers = "/v1/node/call-answers"

// Invokes down the call answers stream.
//
// An agent that sends HeaderCallInvokes (value CallInvokesBinary) on its
// call answers stream's request also reads that request's answer: a
// replica that echoes the header in its answer's head may write invoke
// frames there (AppendInvokeFrame, exactly as on the session stream, the
// fencing token the node's session's), for calls of a node whose session
// it holds too. A hot call's command then goes from the caller's handler
// straight into the stream's connection, and its answer comes back on
// the same connection, instead of through the session's HTTP/2 stream
// and the goroutines on either side of it (its writer, the server's
// frame scheduler, the client's read loop, the session loop). Nothing
// else ever rides the answer; a replica that does not echo the header
// writes nothing there (an older one never does), and an agent that does
// not ask is never sent any, so neither side needs a capability version.
// The agent reads every frame up to the answer's end, so a stream ended
// cleanly (the agent's idle end, the replica's shutdown) loses none; a
// replica whose stream breaks sends what it wrote there and was not
// answered again on the node's session, which the agent's memory of
// recent rendezvous runs at most once.
const (
	HeaderCallInvokes = "Mercator-Call-Invokes"
	CallInvokesBinary = "invoke-1"
)

// The stream on the connection itself.
//
// An agent asking for invokes may also ask for the stream to take its
// connection whole (HTTP/1.1's upgrade: Connection: Upgrade, Upgrade:
// CallAnswersUpgrade, an empty body). A replica that takes it answers
// 101 Switching Protocols (with HeaderCallInvokes echoed), and from then
// on the agent writes answer frames and the replica invoke frames
// straight onto the connection, the same frames without HTTP/1.1's chunks
// around them: no writer goroutine on the agent's side (its HTTP client
// copies a streamed request body from a goroutine of its own) and no
// chunked reader and flush through the response's writers on the
// replica's. The agent ends the stream with an end frame
// (AppendCallAnswersEnd) and closes its side, as it would end the
// request's body (a connection's end alone could be a cut, after which
// the replica sends its unanswered invokes again on the session); the
// replica then closes its own side once nothing more is written, and the
// agent reads every invoke frame up to that end. A replica that predates this,
// or cannot take the connection, answers the request as any other (200,
// its empty body read at once): the agent then opens the stream as
// before, on a request body, and keeps to that for the replica.
const CallAnswersUpgrade = "mercator-call-answers-1"

// MaxCallAnswerFrame bounds one frame: 64 KiB of body (nodeagent's
// coalesceMax) with room for headers. An answer that would not fit is
// posted instead.
const MaxCallAnswerFrame = 256 << 10

// Frame types.
const (
	frameResponse = 1
	frameError    = 2
	frameEnd      = 3
)

// ErrCallAnswersEnd is ReadCallAnswer's answer to the end frame
// (AppendCallAnswersEnd), with which an agent ends a stream on its
// connection (CallAnswersUpgrade): there, unlike on a request's body,
// the connection's end cannot tell a clean end from a cut.
var ErrCallAnswersEnd = errors.New("the call answers stream's end")

// AppendCallAnswersEnd appends the end frame to dst: a length of 1 and
// its type.
func AppendCallAnswersEnd(dst []byte) []byte { return append(dst, 1, frameEnd) }

// CallAnswer is one whole answer on the call answers stream: a response
// (Status, Header, Body) or, when ErrorKind is set, a call that ended
// before its response began (as HeaderCallError and its message).
type CallAnswer struct {
	Rendezvous string
	Status     int
	// Header is the function's response headers, as HeaderCallHeader
	// carries them on a post; nil or empty for an error.
	Header       map[string][]string
	Body         []byte
	ErrorKind    string
	ErrorMessage string
}

// AppendCallAnswer appends a's frame to dst: its length (uvarint), then a
// type byte and the fields, each string or byte string as a uvarint length
// and its bytes, each number a uvarint. A response is the status, the
// number of header values and each as name and value, and the body; an
// error its kind and message.
func AppendCallAnswer(dst []byte, a CallAnswer) []byte {
	n := 1 + strLen(a.Rendezvous)
	if a.ErrorKind != "" {
		n += strLen(a.ErrorKind) + strLen(a.ErrorMessage)
	} else {
		values := 0
		for k, vs := range a.Header {
			for _, v := range vs {
				n += strLen(k) + strLen(v)
				values++
			}
		}
		n += uvarintLen(uint64(a.Status)) + uvarintLen(uint64(values)) + uvarintLen(uint64(len(a.Body))) + len(a.Body)
	}
	dst = binary.AppendUvarint(dst, uint64(n))
	if a.ErrorKind != "" {
		dst = append(dst, frameError)
		dst = appendStr(dst, a.Rendezvous)
		dst = appendStr(dst, a.ErrorKind)
		return appendStr(dst, a.ErrorMessage)
	}
	dst = append(dst, frameResponse)
	dst = appendStr(dst, a.Rendezvous)
	dst = binary.AppendUvarint(dst, uint64(a.Status))
	values := 0
	for _, vs := range a.Header {
		values += len(vs)
	}
	dst = binary.AppendUvarint(dst, uint64(values))
	for k, vs := range a.Header {
		for _, v := range vs {
			dst = appendStr(dst, k)
			dst = appendStr(dst, v)
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(a.Body)))
	return append(dst, a.Body...)
}

// ErrCallAnswerFrame is what a malformed frame decodes to (wrapped with
// what was wrong): the stream cannot be read past it.
var ErrCallAnswerFrame = errors.New("malformed call answer frame")

// ReadCallAnswer reads the next frame from r into buf's storage (grown as
// needed and returned for the next call; the answer's Body aliases it, so
// it is valid until buf is reused). io.EOF at a frame's boundary is the
// stream's clean end, and so is ErrCallAnswersEnd, the end frame's;
// anything else malformed is ErrCallAnswerFrame.
func ReadCallAnswer(r *bufio.Reader, buf []byte) (CallAnswer, []byte, error) {
	n, err := binary.ReadUvarint(r)
	if err == io.EOF {
		return CallAnswer{}, buf, io.EOF
	}
	if err != nil {
		return CallAnswer{}, buf, fmt.Errorf("%w: length: %v", ErrCallAnswerFrame, err)
	}
	if n == 0 || n > MaxCallAnswerFrame {
		return CallAnswer{}, buf, fmt.Errorf("%w: length %d, want 1 to %d", ErrCallAnswerFrame, n, MaxCallAnswerFrame)
	}
	if uint64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return CallAnswer{}, buf, fmt.Errorf("%w: %d bytes: %v", ErrCallAnswerFrame, n, err)
	}
	if n == 1 && buf[0] == frameEnd {
		return CallAnswer{}, buf, ErrCallAnswersEnd
	}
	a, err := DecodeCallAnswer(buf)
	return a, buf, err
}

// DecodeCallAnswer decodes one frame's contents (after its length). Header
// names must be HTTP tokens and values carry no control characters but
// tab, so what a frame carries could have crossed as an HTTP header.
func DecodeCallAnswer(p []byte) (CallAnswer, error) {
	d := frameDecoder{p: p}
	var a CallAnswer
	typ := d.byte()
	a.Rendezvous = d.str()
	switch typ {
	case frameError:
		a.ErrorKind, a.ErrorMessage = d.str(), d.str()
		if d.err == nil && a.ErrorKind == "" {
			d.fail("an error without a kind")
		}
	case frameResponse:
		status := d.uvarint()
		if d.err == nil && (status < 100 || status > 999) {
			d.fail(fmt.Sprintf("status %d", status))
		}
		a.Status = int(status)
		values := d.uvarint()
		if d.err == nil && values > uint64(len(d.p)) { // every value takes at least two bytes
			d.fail(fmt.Sprintf("%d header values in %d bytes", values, len(d.p)))
		}
		for i := uint64(0); i < values && d.err == nil; i++ {
			k, v := d.str(), d.str()
			if d.err == nil && (!validHeaderName(k) || !validHeaderValue(v)) {
				d.fail(fmt.Sprintf("header %q: not an HTTP header", k))
			}
			if a.Header == nil {
				a.Header = map[string][]string{}
			}
			a.Header[k] = append(a.Header[k], v)
		}
		a.Body = d.bytes()
	default:
		d.fail(fmt.Sprintf("type %d", typ))
	}
	if d.err == nil && a.Rendezvous == "" {
		d.fail("no rendezvous")
	}
	if d.err == nil && len(d.p) != 0 {
		d.fail(fmt.Sprintf("%d bytes past the end", len(d.p)))
	}
	if d.err != nil {
		return CallAnswer{}, fmt.Errorf("%w: %v", ErrCallAnswerFrame, d.err)
	}
	return a, nil
}

func appendStr(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func strLen(s string) int { return uvarintLen(uint64(len(s))) + len(s) }

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// frameDecoder reads a frame's fields (call answers and invoke frames);
// the first error sticks and every later read returns zero.
type frameDecoder struct {
	p   []byte
	err error
}

func (d *frameDecoder) fail(what string) {
	if d.err == nil {
		d.err = errors.New(what)
	}
}

func (d *frameDecoder) byte() byte {
	if d.err != nil || len(d.p) == 0 {
		d.fail("truncated")
		return 0
	}
	b := d.p[0]
	d.p = d.p[1:]
	return b
}

func (d *frameDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.p)
	if n <= 0 {
		d.fail("truncated number")
		return 0
	}
	d.p = d.p[n:]
	return v
}

func (d *frameDecoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.p)) {
		d.fail(fmt.Sprintf("a field of %d bytes in %d", n, len(d.p)))
		return nil
	}
	b := d.p[:n:n]
	d.p = d.p[n:]
	return b
}

func (d *frameDecoder) str() string { return string(d.bytes()) }

// FramableHeader reports whether every name and value of h can travel in
// a frame (DecodeCallAnswer refuses a frame that carries one that cannot,
// and with it the rest of the stream): the sender checks, and posts an
// answer that fails.
func FramableHeader(h map[string][]string) bool {
	for k, vs := range h {
		if !validHeaderName(k) {
			return false
		}
		for _, v := range vs {
			if !validHeaderValue(v) {
				return false
			}
		}
	}
	return true
}

// validHeaderName: an HTTP token (RFC 9110).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		switch c {
		case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
			continue
		}
		return false
	}
	return true
}

// validHeaderValue: no control characters but tab.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
