package client

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/mercator/mercator/api"
)

// FilePayload returns the regular file at path, whose os.Stat is fi, as
// the payload of a push (format api.ArtifactFile), without reading it:
// the push checks it as it sends it. Every open checks, and every read
// that reaches the end checks again, that the file still has the size and
// modification time fi gives, so a file changed during a push (or between
// an interrupted push and its resumption) is refused rather than pushed as
// a mixture of its states.
//
// The payload has OpenFile, so a push over plain HTTP on Linux sends the
// file with sendfile (see Payload.OpenFile).
func FilePayload(path string, fi os.FileInfo) Payload {
	size, mtime := fi.Size(), fi.ModTime()
	unchanged := func(f *os.File) error {
		now, err := f.Stat()
		if err != nil {
			return err
		}
		if now.Size() != size || !now.ModTime().Equal(mtime) {
			return fmt.Errorf("%s changed while it was pushed (%d bytes modified %s, now %d bytes modified %s); push it again once it is complete",
				path, size, mtime.Format(time.RFC3339Nano), now.Size(), now.ModTime().Format(time.RFC3339Nano))
		}
		return nil
	}
	openAt := func(offset int64) (*os.File, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		if err := unchanged(f); err != nil {
			f.Close()
			return nil, err
		}
		if _, err := f.Seek(offset, io.SeekStart); err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
	return Payload{
		Size:   size,
		Format: api.ArtifactFile,
		Open: func(offset int64) (io.ReadCloser, error) {
			f, err := openAt(offset)
			if err != nil {
				return nil, err
			}
			return &checkedFile{File: f, check: unchanged}, nil
		},
		OpenFile: openAt,
	}
}

// checkedFile is a file whose end is believed only once check passes.
type checkedFile struct {
	*os.File
	check func(*os.File) error
}

func (c *checkedFile) Read(b []byte) (int, error) {
	n, err := c.File.Read(b)
	if err == io.EOF {
		if cerr := c.check(c.File); cerr != nil {
			return n, cerr
		}
	}
	return n, err
}
