package nodeproto

import (
	"encoding/binary"
	"fmt"
	"time"
)

// The invoke command in binary, on the session stream.
//
// The session stream is newline-delimited JSON (one Command a line), and
// an invoke, the one command sent per function call, cost the control
// plane a JSON encoding and the agent a decoding at every call (about 8%
// of a hot call's CPU on both). An agent that sends HeaderSessionBinary on
// its session request reads, besides JSON lines, binary invoke frames: the
// byte SessionBinaryMarker (which no JSON line starts with), the payload's
// length (uvarint) and the payload (AppendInvokeFrame), with no newline
// after. The control plane sends invokes so only to a session that asked
// (an older agent never asks, and gets JSON); an older control plane
// ignores the header and sends JSON, which the agent still reads. So
// neither side needs a capability version.

// HeaderSessionBinary, on a session request, says the agent reads binary
// invoke frames; its value is SessionBinaryInvoke.
const (
	HeaderSessionBinary = "Mercator-Session-Binary"
	SessionBinaryInvoke = "invoke-1"
)

// SessionBinaryMarker starts a binary frame on the session stream.
const SessionBinaryMarker = 0x00

// MaxInvokeFrame bounds one binary invoke frame's payload: an inline body
// (at most 64 KiB), headers and the function's configuration are far
// below it.
const MaxInvokeFrame = 8 << 20

// Flags of an invoke frame.
const (
	invokeHasFunction = 1 << iota
	invokeBodyInline
	invokeNoWait
	invokeLogs
	invokeAnswerStream
	invokeUnframedLogs
)

// AppendInvokeFrame appends the session frame of an invoke command sent
// under fencing to dst: the marker, the payload's length, and the
// payload: every field of the InvokeCommand and its FunctionSpec, in
// their declaration order (strings and byte strings as a uvarint length
// and the bytes, signed numbers as varints, maps as a count of entries and
// each entry). TestInvokeFrameCarriesEveryField fails when a field is
// added to either struct and not here.
func AppendInvokeFrame(dst []byte, fencing uint64, c *InvokeCommand) []byte {
	p := make([]byte, 0, 512+len(c.Body))
	p = binary.AppendUvarint(p, fencing)
	p = appendStr(p, c.CallID)
	p = appendStr(p, c.Rendezvous)
	p = appendStr(p, c.URL)
	var flags byte
	for _, f := range []struct {
		on  bool
		bit byte
	}{{c.Function != nil, invokeHasFunction}, {c.BodyInline, invokeBodyInline}, {c.NoWait, invokeNoWait}, {c.Logs, invokeLogs},
		{c.AnswerStream, invokeAnswerStream}, {c.Function != nil && c.Function.UnframedLogs, invokeUnframedLogs}} {
		if f.on {
			flags |= f.bit
		}
	}
	p = append(p, flags)
	p = appendMulti(p, c.Header)
	p = binary.AppendUvarint(p, uint64(len(c.Body)))
	p = append(p, c.Body...)
	p = binary.AppendVarint(p, c.ContentLength)
	p = binary.AppendVarint(p, int64(c.Timeout))
	if fn := c.Function; fn != nil {
		for _, s := range []string{fn.ID, fn.AppID, fn.Name, fn.AppName, fn.Image, fn.RegistryAuth} {
			p = appendStr(p, s)
		}
		for _, v := range []int64{fn.MemoryMB, fn.MilliCPUs, int64(fn.GPUs), int64(fn.Timeout), int64(fn.IdleTimeout), int64(fn.MaxConcurrency), int64(fn.TargetConcurrency)} {
			p = binary.AppendVarint(p, v)
		}
		p = binary.AppendUvarint(p, uint64(len(fn.Config)))
		for k, v := range fn.Config {
			p = appendStr(appendStr(p, k), v)
		}
	}
	dst = append(dst, SessionBinaryMarker)
	dst = binary.AppendUvarint(dst, uint64(len(p)))
	return append(dst, p...)
}

// appendMulti appends a multi-valued map: the count of keys, then each key
// with the count of its values and the values.
func appendMulti(p []byte, m map[string][]string) []byte {
	p = binary.AppendUvarint(p, uint64(len(m)))
	for k, vs := range m {
		p = appendStr(p, k)
		p = binary.AppendUvarint(p, uint64(len(vs)))
		for _, v := range vs {
			p = appendStr(p, v)
		}
	}
	return p
}

// InvokeFrameLen is, for the start of a session stream's buffered bytes
// that begins with SessionBinaryMarker, the frame's whole length (marker
// and length included); 0 while more bytes are needed to tell. A length
// over MaxInvokeFrame is an error: the stream cannot be read past it.
func InvokeFrameLen(data []byte) (int, error) {
	n, k := binary.Uvarint(data[1:])
	switch {
	case k == 0:
		return 0, nil
	case k < 0 || n > MaxInvokeFrame:
		return 0, fmt.Errorf("%w: an invoke frame's length is over %d", ErrInvokeFrame, MaxInvokeFrame)
	}
	return 1 + k + int(n), nil
}

// ErrInvokeFrame is what a malformed invoke frame decodes to.
var ErrInvokeFrame = fmt.Errorf("malformed invoke frame")

// DecodeInvokeFrame decodes a whole frame (as InvokeFrameLen measured it)
// into the Command it carries. Nothing in the result aliases frame.
func DecodeInvokeFrame(frame []byte) (Command, error) {
	if len(frame) == 0 || frame[0] != SessionBinaryMarker {
		return Command{}, fmt.Errorf("%w: no marker", ErrInvokeFrame)
	}
	d := frameDecoder{p: frame[1:]}
	if n := d.uvarint(); d.err == nil && n != uint64(len(d.p)) {
		d.fail(fmt.Sprintf("length %d, %d bytes follow", n, len(d.p)))
	}
	cmd := Command{Kind: KindInvoke, FencingToken: d.uvarint()}
	c := &InvokeCommand{CallID: d.str(), Rendezvous: d.str(), URL: d.str()}
	flags := d.byte()
	c.BodyInline, c.NoWait, c.Logs, c.AnswerStream = flags&invokeBodyInline != 0, flags&invokeNoWait != 0, flags&invokeLogs != 0, flags&invokeAnswerStream != 0
	c.Header = d.multi()
	if b := d.bytes(); len(b) > 0 {
		c.Body = append([]byte(nil), b...)
	}
	c.ContentLength, c.Timeout = d.varint(), time.Duration(d.varint())
	if flags&invokeHasFunction != 0 {
		fn := &FunctionSpec{ID: d.str(), AppID: d.str(), Name: d.str(), AppName: d.str(), Image: d.str(), RegistryAuth: d.str()}
		fn.MemoryMB, fn.MilliCPUs, fn.GPUs = d.varint(), d.varint(), int(d.varint())
		fn.Timeout, fn.IdleTimeout = time.Duration(d.varint()), time.Duration(d.varint())
		fn.MaxConcurrency, fn.TargetConcurrency = int(d.varint()), int(d.varint())
		fn.UnframedLogs = flags&invokeUnframedLogs != 0
		if n := d.count(); n > 0 {
			fn.Config = make(map[string]string, n)
			for i := 0; i < n && d.err == nil; i++ {
				k := d.str()
				fn.Config[k] = d.str()
			}
		}
		c.Function = fn
	}
	if d.err == nil && len(d.p) != 0 {
		d.fail(fmt.Sprintf("%d bytes past the end", len(d.p)))
	}
	if d.err != nil {
		return Command{}, fmt.Errorf("%w: %v", ErrInvokeFrame, d.err)
	}
	cmd.Invoke = c
	return cmd, nil
}

func (d *frameDecoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.p)
	if n <= 0 {
		d.fail("truncated number")
		return 0
	}
	d.p = d.p[n:]
	return v
}

// count is a count of entries, each at least one byte, so never more than
// the bytes left.
func (d *frameDecoder) count() int {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.p)) {
		d.fail(fmt.Sprintf("%d entries in %d bytes", n, len(d.p)))
		return 0
	}
	return int(n)
}

func (d *frameDecoder) multi() map[string][]string {
	n := d.count()
	if n == 0 {
		return nil
	}
	m := make(map[string][]string, n)
	for i := 0; i < n && d.err == nil; i++ {
		k := d.str()
		vs := make([]string, d.count())
		for j := range vs {
			vs[j] = d.str()
		}
		m[k] = vs
	}
	return m
}
