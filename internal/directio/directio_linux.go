package directio

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

func createDirect(path string, perm os.FileMode) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_DIRECT, perm)
	if err == nil {
		return f, true, nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return nil, false, err
	}
	f, err = os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	return f, false, err
}

func openAppend(path string, direct bool) (*os.File, bool, error) {
	if direct {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|unix.O_DIRECT, 0)
		if err == nil {
			return f, true, nil
		}
		if !errors.Is(err, unix.EINVAL) {
			return nil, false, err
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	return f, false, err
}

func stopDirect(f *os.File) error {
	fd := f.Fd()
	flags, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	_, err = unix.FcntlInt(fd, unix.F_SETFL, flags&^unix.O_DIRECT)
	return err
}

func isEINVAL(err error) bool { return errors.Is(err, unix.EINVAL) }

// writeBehind starts writeback of [off, off+n) and waits for what was
// started before it, so a long buffered write keeps a bounded amount of
// dirty data and its final fsync has little left to do. Errors are
// ignored: this is pacing, and the final fsync reports a failed write.
func writeBehind(f *os.File, off, n int64) {
	fd := int(f.Fd())
	_ = unix.SyncFileRange(fd, off, n, unix.SYNC_FILE_RANGE_WRITE)
	if off > 0 {
		_ = unix.SyncFileRange(fd, 0, off, unix.SYNC_FILE_RANGE_WAIT_BEFORE)
	}
}
