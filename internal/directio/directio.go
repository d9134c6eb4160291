// Package directio writes large files of content (Artifact copies on a
// node, uploads on the control plane) straight to the disk where the
// filesystem allows, bypassing the page cache, and through the cache paced
// by early writeback where it does not.
//
// Why: on a machine whose cores are busy hashing the same bytes, the
// kernel's copy of every byte into the page cache costs about as much CPU
// as the hash itself, and a copy of tens of gigabytes would push everything
// else the machine caches out of memory and then stall every writer on the
// machine while the kernel flushes it. A direct write costs no copy; the
// readers of the content (containers, a node fetching it) fill the cache
// with what they actually read.
//
// Direct writes need aligned lengths, offsets and buffers (Align). A Writer
// writes aligned pieces directly and turns direct I/O off for the rest of
// the file at the first piece that is not aligned (the tail of the
// content), or when the filesystem refuses it (tmpfs on older kernels).
// hashcopy's pieces are aligned for this.
//
// The node agent and the control plane import it.
package directio

import (
	"os"
	"unsafe"
)

// Align is the alignment direct writes need on the filesystems content
// lives on.
const Align = 4096

// behindWindow is how much of a buffered file is written before its
// writeback is started.
const behindWindow = 32 << 20

// Writer writes one file sequentially. It is not safe for concurrent use.
type Writer struct {
	f       *os.File
	direct  bool
	off     int64 // where the next write lands
	flushed int64 // writeback started up to here (buffered writes)
}

// Create creates path (which must not exist) with perm, for direct writes
// where the filesystem allows them.
func Create(path string, perm os.FileMode) (*Writer, error) {
	f, direct, err := createDirect(path, perm)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f, direct: direct}, nil
}

// Append opens an existing file to write after its end, directly when its
// size is aligned and the filesystem allows it.
func Append(path string) (*Writer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	f, direct, err := openAppend(path, fi.Size()%Align == 0)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f, direct: direct, off: fi.Size(), flushed: fi.Size()}, nil
}

// Write writes p at the end of what was written.
func (w *Writer) Write(p []byte) (int, error) {
	if w.direct && (len(p)%Align != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(p)))%Align != 0) {
		w.direct = stopDirect(w.f) != nil
	}
	n, err := w.f.Write(p)
	if err != nil && w.direct && n == 0 && isEINVAL(err) {
		// The filesystem took O_DIRECT at open and refuses it now.
		if w.direct = stopDirect(w.f) != nil; !w.direct {
			n, err = w.f.Write(p)
		}
	}
	w.off += int64(n)
	if err != nil {
		return n, err
	}
	if !w.direct && w.off-w.flushed >= behindWindow {
		writeBehind(w.f, w.flushed, w.off-w.flushed)
		w.flushed = w.off
	}
	return n, nil
}

// Sync makes what was written durable.
func (w *Writer) Sync() error { return w.f.Sync() }

// Close closes the file without syncing it.
func (w *Writer) Close() error { return w.f.Close() }

// Direct reports whether writes still go around the page cache.
func (w *Writer) Direct() bool { return w.direct }
