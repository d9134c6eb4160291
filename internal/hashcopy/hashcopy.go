// Package hashcopy copies a stream to a writer while hashing it, with the
// read, the hash and the write running at once on different pieces of the
// stream. A copy then goes at the pace of the slowest of the three rather
// than at their sum, which is the difference between a node landing an
// Artifact at its disk's rate and at half of it: on a machine where SHA-256
// and the disk each run near 2 GB/s, doing them one after the other would
// publish a link floor of 1 GB/s that the machine does not have.
//
// The control plane (receiving uploads), the client (pushing them, hashing
// as it sends) and the node agent (fetching Artifact content) import it.
package hashcopy

import (
	"errors"
	"io"
	"sync"
	"unsafe"

	"github.com/mercator/mercator/internal/directio"
)

// PieceSize is the size of one piece in flight, and Pieces how many are in
// flight at most: a copy holds up to Pieces×PieceSize (32 MiB) of buffers,
// allocated as the pipeline fills, so a copy whose stages keep pace with
// each other holds a few pieces only.
//
// Why 4 MiB: every piece costs each stage a hand-off (a goroutine woken on
// the other core), and on a 2-core machine pushing an upload over loopback
// 1 MiB pieces left a quarter of the CPU idle in those hand-offs; 4 MiB
// pieces carried the same upload about 12% faster (860 to 970 MB/s, three
// runs each), 256 KiB pieces 20% slower. Eight of them let the reading
// stage run ahead of a direct write that stalls.
const (
	PieceSize = 4 << 20
	Pieces    = 8
)

// CacheRead is the most a read through InCache returns at once: small
// enough that the bytes are still in the core's cache (L2, about 1 MiB
// on the machines this was measured on) when a checksum runs over them
// right after the read, as a CRC-32C does (TeeReader), instead of going
// back to memory for them. On the 2-core benchmark machine a control
// plane's CRC-32C of an upload so cost 0.05 ns a byte against 0.13 over
// reads of up to a piece.
const CacheRead = 256 << 10

// InCache returns r, reading at most CacheRead bytes at a time.
func InCache(r io.Reader) io.Reader { return cacheSized{r} }

type cacheSized struct{ r io.Reader }

func (c cacheSized) Read(b []byte) (int, error) {
	if len(b) > CacheRead {
		b = b[:CacheRead]
	}
	return c.r.Read(b)
}

// WriteError wraps an error of the destination, so a caller can tell a
// failure to write (a full disk) from a failure to read (a cut connection).
type WriteError struct{ Err error }

func (e *WriteError) Error() string { return e.Err.Error() }
func (e *WriteError) Unwrap() error { return e.Err }

// Align is the alignment of every piece's buffer, so a destination that
// writes around the page cache (package directio) can write whole pieces
// as they come.
const Align = directio.Align

func alignedPiece() []byte {
	b := make([]byte, PieceSize+Align)
	off := (Align - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%Align)) % Align
	return b[off : off+PieceSize : off+PieceSize]
}

type piece struct {
	buf []byte
	n   int
}

// Copy copies src to dst, and every byte it writes to h as well, until src
// ends or limit bytes were copied; a src longer than limit is read only to
// limit+1 bytes, so the caller sees that it was too long (written > limit)
// without reading the rest. It returns how many bytes were written to dst.
//
// h is a hash.Hash, or several behind io.MultiWriter (the control plane
// computes a SHA-256 and a CRC-32C of an upload in one pass); it is an
// io.Writer so that several can share the hashing stage. An error of h
// ends the copy and comes back as it is (a hash's Write never fails).
//
// When it returns nil, h has seen exactly the bytes written. When it
// returns an error, h may have seen bytes that were not written; a caller
// that keeps h across copies must discard it then. An error of dst comes
// back as *WriteError. Copy may return while a read of src is still
// blocked; closing src ends it.
func Copy(dst io.Writer, src io.Reader, h io.Writer, limit int64) (written int64, err error) {
	free := make(chan []byte, Pieces)
	allocated := 0 // pieces made so far; only the read stage makes them
	toHash := make(chan piece, Pieces)
	toWrite := make(chan piece, Pieces)
	// stop is closed at the first failure, after firstErr is set; every
	// stage selects on it, so none waits on a stage that has ended.
	stop := make(chan struct{})
	var once sync.Once
	var firstErr error
	fail := func(err error) { once.Do(func() { firstErr = err; close(stop) }) }
	go func() { // read
		defer close(toHash)
		src := io.LimitReader(src, limit+1)
		for {
			var buf []byte
			if len(free) == 0 && allocated < Pieces {
				allocated++
				buf = alignedPiece()
			} else {
				select {
				case buf = <-free:
				case <-stop:
					return
				}
			}
			n, err := io.ReadFull(src, buf)
			if n > 0 {
				select {
				case toHash <- piece{buf, n}:
				case <-stop:
					return
				}
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return
			}
			if err != nil {
				fail(err)
				return
			}
		}
	}()
	go func() { // hash
		defer close(toWrite)
		for p := range toHash {
			if _, err := h.Write(p.buf[:p.n]); err != nil {
				fail(err)
				return
			}
			select {
			case toWrite <- p:
			case <-stop:
				return
			}
		}
	}()
	failed := false
	for p := range toWrite { // write, here
		if !failed {
			n, err := dst.Write(p.buf[:p.n])
			written += int64(n)
			if err == nil && n < p.n {
				err = io.ErrShortWrite
			}
			if err != nil {
				failed = true
				fail(&WriteError{Err: err})
			}
		}
		free <- p.buf
	}
	select {
	case <-stop:
		return written, firstErr
	default:
		return written, nil
	}
}
