package client

import (
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"fmt"
	"hash"
	"io"

	"github.com/mercator/mercator/api"
)

// This file holds the client's side of a push that checks as it sends: the
// running digest of what went out, and how it goes back to what the
// control plane actually holds when a send breaks.

// markEvery is how far apart runningDigest saves its state, and keepMarks
// how many saved states it keeps: a broken send rewinds to the last one at
// or before what the control plane holds (which trails what the digest has
// seen by the bytes in flight, and by checkLead more when the digest is
// computed by a read alongside a file's send), rereading at most markEvery
// bytes, and from the start only when the content is longer than
// keepMarks×markEvery (1 TiB). A saved state is at most about a hundred
// bytes (a SHA-256's), so all of them are at most 2 MB.
const (
	markEvery = 64 << 20
	keepMarks = 1 << 14
)

// runningDigest is a digest of a payload's first n bytes, fed with the
// bytes as they are sent (it is the writer given to hashcopy.Copy), so the
// client's check costs no pass over the content of its own and overlaps
// the send instead of preceding it. The digest is a CRC-32C when it is the
// check a push states at its commit (newSendCheck), and a SHA-256 when the
// client hashes content first to ask whether the control plane has it
// (newContentDigest); either can be saved and restored, which is all
// rewind needs.
//
// A send that breaks leaves it ahead of the control plane: bytes hashed
// here may never have arrived. rewind takes it back to the offset the
// upload stands at. It is not safe for concurrent use; the send that feeds
// it must have returned before rewind or sum is called.
type runningDigest struct {
	hash.Hash       // over bytes [0, n)
	n         int64 // bytes hashed
	marks     []digestMark
	every     int64            // markEvery, or less in tests
	keep      int              // keepMarks, or fewer in tests
	fresh     func() hash.Hash // a new hash of this kind, for restore
}

type digestMark struct {
	n     int64
	state []byte
}

func newRunningDigest(fresh func() hash.Hash) *runningDigest {
	return &runningDigest{Hash: fresh(), every: markEvery, keep: keepMarks, fresh: fresh}
}

// newSendCheck is the check a push computes as it sends and states at the
// commit (api.CommitRequest.CRC32C): a CRC-32C, which catches what the
// check is for, bytes damaged or changed between the client's read and
// the control plane's disk, at a small fraction of SHA-256's CPU. The
// version's identity is the control plane's SHA-256, not this.
func newSendCheck() *runningDigest {
	return newRunningDigest(func() hash.Hash { return api.NewCRC32C() })
}

// newContentDigest is the content's SHA-256, what a version is known by,
// for asking the control plane whether it already holds the content.
func newContentDigest() *runningDigest { return newRunningDigest(sha256.New) }

// Write hashes b as the next bytes of the content, saving the state when
// it crosses a mark.
func (d *runningDigest) Write(b []byte) (int, error) {
	d.Hash.Write(b)
	before := d.n
	d.n += int64(len(b))
	if d.n/d.every > before/d.every {
		d.mark()
	}
	return len(b), nil
}

// Reset starts over at byte 0.
func (d *runningDigest) Reset() {
	d.Hash.Reset()
	d.n, d.marks = 0, nil
}

func (d *runningDigest) mark() {
	state, err := d.Hash.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return // no mark: a rewind rereads further back, nothing worse
	}
	d.marks = append(d.marks, digestMark{n: d.n, state: state})
	if len(d.marks) > d.keep {
		d.marks = append(d.marks[:0], d.marks[len(d.marks)-d.keep:]...)
	}
}

// rewind makes the digest cover exactly bytes [0, to) of the payload:
// from the last saved state at or before to (or from byte 0), rereading
// the bytes from there to to through open. It is how a push resumes, after
// a broken send or in a later process, at the offset the upload stands.
func (d *runningDigest) rewind(to int64, open func(offset int64) (io.ReadCloser, error)) error {
	if d.n > to {
		d.restore(to)
	}
	if d.n == to {
		return nil
	}
	r, err := open(d.n)
	if err != nil {
		return err
	}
	defer r.Close()
	from := d.n
	if n, err := io.CopyN(d, r, to-from); err != nil {
		d.Reset() // part of the range was hashed: start over next time
		return fmt.Errorf("rereading bytes %d to %d of the content to resume its digest (%d read): %w", from, to, n, err)
	}
	return nil
}

// restore goes back to the last mark at or before to, or to byte 0.
func (d *runningDigest) restore(to int64) {
	for i := len(d.marks) - 1; i >= 0; i-- {
		m := d.marks[i]
		if m.n > to {
			continue
		}
		h := d.fresh()
		if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(m.state); err != nil {
			break
		}
		d.Hash, d.n, d.marks = h, m.n, d.marks[:i+1]
		return
	}
	d.Reset()
}

// sum is the digest of the bytes hashed, in lowercase hex digits, most
// significant first: 64 for a SHA-256, 8 for a CRC-32C (as
// api.FormatCRC32C spells it).
func (d *runningDigest) sum() string { return hex.EncodeToString(d.Hash.Sum(nil)) }
