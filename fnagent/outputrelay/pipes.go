package outputrelay

import (
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Names are the pipes' names in the socket directory: stdout's, then
// stderr's.
var Names = [2]string{"mercator.stdout", "mercator.stderr"}

// Pipes are the agent's ends of one container's two output pipes.
type Pipes struct {
	read [2]*os.File
	// hold are write ends the agent keeps open until Close, so a read
	// waits for the container's output instead of ending before the
	// container has opened its end (a pipe with no writer reads as ended).
	hold    [2]*os.File
	done    chan struct{} // closed when both copies have ended
	copying bool          // Copy was called
	carried atomic.Int64  // bytes copied, both pipes together
}

// Make creates the two pipes in dir, writable by any user (the function
// runs as whatever user its image names, and dir is the container's socket
// directory, already open to it), and opens the agent's ends. On error
// nothing is left open; the files are removed with dir.
func Make(dir string) (*Pipes, error) {
	p := &Pipes{done: make(chan struct{})}
	for i, name := range Names {
		path := filepath.Join(dir, name)
		if err := unix.Mkfifo(path, 0o600); err != nil {
			p.closeFiles()
			return nil, &os.PathError{Op: "mkfifo", Path: path, Err: err}
		}
		// The mode is set apart from mkfifo's, which the umask narrows.
		if err := os.Chmod(path, 0o622); err != nil {
			p.closeFiles()
			return nil, err
		}
		// Non-blocking, so the read end opens with no writer yet and its
		// reads wait in Go's poller rather than in a thread.
		r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			p.closeFiles()
			return nil, err
		}
		p.read[i] = r
		w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			p.closeFiles()
			return nil, err
		}
		p.hold[i] = w
	}
	return p, nil
}

// Copy copies stdout's pipe to w[0] and stderr's to w[1] until Close,
// each in a goroutine of its own; the writers must be safe to call from
// both at once. It is called at most once.
func (p *Pipes) Copy(w [2]io.Writer) {
	p.copying = true
	ended := make(chan struct{}, 2)
	for i := range p.read {
		go func() {
			_, _ = io.Copy(counted{&p.carried, w[i]}, p.read[i])
			ended <- struct{}{}
		}()
	}
	go func() {
		<-ended
		<-ended
		close(p.done)
	}()
}

// Carried is how many bytes the copies have written so far.
func (p *Pipes) Carried() int64 { return p.carried.Load() }

// counted is a writer adding what it writes to n.
type counted struct {
	n *atomic.Int64
	w io.Writer
}

func (c counted) Write(b []byte) (int, error) {
	c.n.Add(int64(len(b)))
	return c.w.Write(b)
}

// Close ends the copies once the container's writers are gone: it drops
// the agent's own write ends, so a copy reads to the end of what the
// container wrote and then ends, and waits for that up to grace (a
// writer still open past its process's exit is not expected, as every
// process of a container ends with its first); what is left unread then
// is dropped. Close returns when both copies have ended; without a Copy
// (no container was made to write) it only closes the pipes, and nil
// Pipes close nothing. Copy and Close are called from one goroutine, or
// ordered by the caller.
func (p *Pipes) Close(grace time.Duration) {
	if p == nil {
		return
	}
	if !p.copying {
		p.closeFiles()
		return
	}
	for _, f := range p.hold {
		f.Close()
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
	for _, f := range p.read {
		f.Close()
	}
	<-p.done
}

// closeFiles closes whatever Make opened.
func (p *Pipes) closeFiles() {
	for _, fs := range [][2]*os.File{p.hold, p.read} {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
}
