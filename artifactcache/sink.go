package artifactcache

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/mercator/mercator/internal/directio"
	"github.com/mercator/mercator/internal/hashcopy"
)

// contentSink receives a version's bytes in order.
type contentSink interface {
	io.Writer
	// finish completes and fsyncs what was written.
	finish() error
	// abort releases what finish would have, after a failure.
	abort()
}

// sinkError is a failure of the sink rather than of the transfer: disk
// marks one writing to disk, otherwise the content itself was malformed.
type sinkError struct {
	err  error
	disk bool
}

func (e *sinkError) Error() string { return e.err.Error() }
func (e *sinkError) Unwrap() error { return e.err }

// fileSink writes a file version, directly to the disk where the
// filesystem allows (package directio says why).
type fileSink struct{ f *directio.Writer }

func newFileSink(path string) (*fileSink, error) {
	f, err := directio.Create(path, 0o444)
	if err != nil {
		return nil, err
	}
	return &fileSink{f: f}, nil
}

func (s *fileSink) Write(p []byte) (int, error) {
	n, err := s.f.Write(p)
	if err != nil {
		return n, &sinkError{err: err, disk: true}
	}
	return n, nil
}

func (s *fileSink) finish() error {
	if err := s.f.Sync(); err != nil {
		s.f.Close()
		return &sinkError{err: err, disk: true}
	}
	if err := s.f.Close(); err != nil {
		return &sinkError{err: err, disk: true}
	}
	return nil
}

func (s *fileSink) abort() { s.f.Close() }

// tarSink extracts a tar stream into a directory as it arrives: regular
// files and directories only, every name inside the directory. Anything
// else (a link, a device, a name that climbs out, a sparse file) makes the
// content invalid. The bytes after the archive's end are read too, because the
// digest is over the whole stream.
type tarSink struct {
	pw   *io.PipeWriter
	done chan error
}

func newTarSink(dir string) (*tarSink, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	s := &tarSink{pw: pw, done: make(chan error, 1)}
	go func() {
		err := extractTar(pr, dir)
		if err == nil {
			_, err = io.Copy(io.Discard, pr)
		}
		pr.CloseWithError(err)
		s.done <- err
	}()
	return s, nil
}

func (s *tarSink) Write(p []byte) (int, error) {
	n, err := s.pw.Write(p)
	if err != nil {
		return n, s.failure(err)
	}
	return n, nil
}

func (s *tarSink) failure(err error) error {
	var se *sinkError
	if errors.As(err, &se) {
		return se
	}
	return &sinkError{err: err}
}

func (s *tarSink) finish() error {
	s.pw.Close()
	if err := <-s.done; err != nil {
		return s.failure(err)
	}
	return nil
}

func (s *tarSink) abort() {
	s.pw.CloseWithError(errors.New("copy abandoned"))
	<-s.done
}

func extractTar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	var dirs []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if isSparse(h) {
			// Before a byte of it is written: its holes would be.
			return fmt.Errorf("entry %q is a sparse file of %d bytes; an artifact holds no sparse entries, because their holes would be written out in full while the node's budget counts only the archive's bytes: archive it without sparse support (GNU tar without --sparse/-S)", h.Name, h.Size)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." && h.Typeflag == tar.TypeDir {
			continue
		}
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") || strings.ContainsRune(name, 0) {
			return fmt.Errorf("entry %q is outside the artifact", h.Name)
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return &sinkError{err: err, disk: true}
			}
			dirs = append(dirs, target)
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return &sinkError{err: err, disk: true}
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode)&0o555|0o444)
			if err != nil {
				return &sinkError{err: err, disk: errors.Is(err, syscall.ENOSPC) || !errors.Is(err, os.ErrExist)}
			}
			_, err = io.Copy(f, tr)
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				var pe *os.PathError
				return &sinkError{err: err, disk: errors.As(err, &pe)}
			}
		default:
			return fmt.Errorf("entry %q is a %s; an artifact holds regular files and directories only", h.Name, typeName(h.Typeflag))
		}
	}
	dirs = append(dirs, dir)
	for _, d := range dirs {
		if err := syncDir(d); err != nil {
			return &sinkError{err: err, disk: true}
		}
	}
	return nil
}

// isSparse reports whether h is a sparse file in any of the forms the tar
// reader expands: the old GNU type 'S', or PAX records of GNU's sparse
// formats 0.0, 0.1 and 1.0 on a regular entry. The reader fills such an
// entry's holes with zeros, so its Size is what extracting it would write,
// which can be any multiple of the bytes it took in the archive (a 10 KiB
// archive became a 512 MiB file). Refusing it keeps what lands on disk
// within the archive's own size, which is what the budget counts.
func isSparse(h *tar.Header) bool {
	if h.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

func typeName(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "symbolic link"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "device"
	case tar.TypeFifo:
		return "named pipe"
	}
	return fmt.Sprintf("entry of type %q", t)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// pipeline copies body into sink while hashing it (hashcopy.Copy: read,
// hash and write at once), reading at most limit+1 bytes, and finishes
// (fsyncs) the sink. It returns how many bytes arrived and their hex digest.
func pipeline(body io.Reader, sink contentSink, limit int64) (int64, string, error) {
	h := sha256.New()
	n, err := hashcopy.Copy(sink, body, h, limit)
	if err != nil {
		sink.abort()
		var we *hashcopy.WriteError
		if errors.As(err, &we) {
			return n, "", we.Err
		}
		return n, "", err
	}
	if err := sink.finish(); err != nil {
		return n, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}
