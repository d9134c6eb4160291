// Package fdksocket finds, dials and waits for the listener an FDK opens in
// a function container's socket directory (the http-stream contract's
// FN_LISTENER), from the host side. The directory is writable by the
// container, so nothing in it is trusted: a link may only point beside
// itself, and the listener is checked to be a socket through a descriptor
// before it is dialed. Only package fnagent uses it.
package fdksocket

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The http-stream contract's fixed names.
const (
	// DirInContainer is where the socket directory is mounted.
	DirInContainer = "/tmp/iofs"
	// Name is the listener's name in it.
	Name = "lsnr.sock"
)

// Resolve finds the listener in the host directory dir: lsnr.sock
// itself, or, when lsnr.sock is a symlink (FDKs listen on a phony socket
// and link it into place), the link's target, which must name a file in
// the same directory, relatively or as an absolute path under /tmp/iofs as
// the container sees it. Any other target is refused: the container wrote
// that link, and the engine runs as root on the host.
func Resolve(dir string) (string, error) {
	path := filepath.Join(dir, Name)
	info, err := os.Lstat(path)
	if err != nil {
		return "", err
	}
	if info.Mode()&os.ModeSymlink == 0 {
		return path, nil
	}
	target, err := os.Readlink(path)
	if err != nil {
		return "", err
	}
	if filepath.IsAbs(target) {
		rel, err := filepath.Rel(DirInContainer, filepath.Clean(target))
		if err != nil {
			return "", fmt.Errorf("%s links to %q, outside %s", Name, target, DirInContainer)
		}
		target = rel
	}
	name := filepath.Clean(target)
	if name == "." || name == ".." || strings.Contains(name, "/") {
		return "", fmt.Errorf("%s links to %q, which is not a file beside it", Name, target)
	}
	return filepath.Join(dir, name), nil
}

// Dial connects to the listener in dir. The file is opened with
// O_PATH|O_NOFOLLOW and checked to be a socket before connecting through
// /proc/self/fd, so a container that swaps the file for a symlink between
// the check and the connect still cannot point the engine anywhere else.
// (It also keeps the connect path short whatever SocketRoot is: sun_path
// holds 108 bytes.)
func Dial(ctx context.Context, dir string) (net.Conn, error) {
	path, err := Resolve(dir)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%s is not a socket", path)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}

// ErrExited is Wait's answer when the container ended first.
var ErrExited = errors.New("the container exited")

// Wait waits until a connection to the listener in dir succeeds,
// the container exits (ErrExited), or ctx ends. A connection is the test,
// not the file's existence: a server that binds lsnr.sock directly creates
// the file before it listens.
//
// The directory is watched (inotify) rather than polled alone: an FDK
// creates its socket, or the lsnr.sock symlink to it, once it listens, and
// the event wakes the wait at once, where a poll found it up to a poll
// interval late on every cold start. A short poll remains behind the
// watch, for the moment between a direct bind and its listen (no event
// follows it) and for a system without inotify.
func Wait(ctx context.Context, dir string, exited <-chan struct{}) error {
	events, stop := watchDir(dir)
	defer stop()
	const first, most = 2 * time.Millisecond, 25 * time.Millisecond
	delay := first
	var last error
	for {
		dialCtx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := Dial(dialCtx, dir)
		cancel()
		if err == nil {
			conn.Close()
			return nil
		}
		last = err
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w (last attempt: %v)", ctx.Err(), last)
		case <-exited:
			timer.Stop()
			return ErrExited
		case <-events:
			timer.Stop()
			delay = first // something appeared: look again soon if it is not listening yet
			continue
		case <-timer.C:
		}
		delay = min(delay*2, most)
	}
}

// watchDir reports changes to dir's entries (created, moved in, changed)
// on the returned channel, coalesced, until stop is called. Without
// inotify the channel is nil, which never fires.
func watchDir(dir string) (events <-chan struct{}, stop func()) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, func() {}
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ATTRIB); err != nil {
		unix.Close(fd)
		return nil, func() {}
	}
	// A non-blocking descriptor goes to Go's poller, so Close ends the
	// pending Read and the goroutine with it.
	f := os.NewFile(uintptr(fd), "inotify:"+dir)
	ch := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := f.Read(buf); err != nil {
				return
			}
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}()
	return ch, func() { f.Close() }
}
