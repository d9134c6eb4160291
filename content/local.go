package content

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/mercator/mercator/failure"
)

// ReadPath is the route prefix under which the local store serves signed
// reads: GET ReadPath + DIGEST?expires=UNIX&sig=SIGNATURE. It is not part
// of the public API: the signature is the credential, so it sits beside the
// node protocol rather than behind an API token.
const ReadPath = "/v1/content/"

// keySize is the length of the signing key in bytes.
const keySize = 32

// Local is the embedded content store: a directory of files named by digest
// (DIR/sha256/ab/abcdef…), served by the control plane itself through
// signed, expiring URLs.
//
// A URL names one digest and one expiry, and carries an HMAC-SHA256 of both
// under a key only this server holds. A node can read that object until the
// moment passes and nothing else, and since content is immutable and named
// by digest, a leaked URL exposes exactly the bytes it was minted for. The
// key is generated on first start into a file of mode 0600; a key file that
// others can read is refused rather than used, as is every credential file
// Mercator reads.
//
// Several control-plane replicas sharing one database cannot share a Local
// store (each has its own directory); that is what the S3 store is for.
type Local struct {
	dir string
	signedReads
}

// OpenLocal opens (creating when missing) the store in dir with the signing
// key in keyFile (created, mode 0600, when missing). baseURL is the control
// plane's public URL, under which reads are minted. now may be nil.
func OpenLocal(dir, keyFile, baseURL string, now func() time.Time) (*Local, error) {
	if err := os.MkdirAll(filepath.Join(dir, "sha256"), 0o700); err != nil {
		return nil, fmt.Errorf("content store: %w", err)
	}
	key, err := loadOrCreateKey(keyFile)
	if err != nil {
		return nil, err
	}
	return &Local{dir: dir, signedReads: newSignedReads(key, baseURL, now)}, nil
}

// loadOrCreateKey reads a hex key from path, or writes a new random one
// there with mode 0600 (through a temporary file and a rename, so a crash
// never leaves a short key behind).
func loadOrCreateKey(path string) ([]byte, error) {
	if fi, err := os.Stat(path); err == nil {
		if fi.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("content signing key %s is readable by others (mode %o); run `chmod 600 %s`", path, fi.Mode().Perm(), path)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("content signing key: %w", err)
		}
		key, err := hex.DecodeString(strings.TrimSpace(string(raw)))
		if err != nil || len(key) != keySize {
			return nil, fmt.Errorf("content signing key %s is not %d hex-encoded bytes; remove it to have a new one generated (reads already minted stop working)", path, keySize)
		}
		return key, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("content signing key: %w", err)
	}
	key := make([]byte, keySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("content signing key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("content signing key: %w", err)
	}
	return key, nil
}

func (l *Local) path(digest string) string {
	return filepath.Join(l.dir, "sha256", digest[:2], digest)
}

// Describe implements Store.
func (l *Local) Describe() string { return "local directory " + l.dir }

// Stat implements Store.
func (l *Local) Stat(ctx context.Context, digest string) (int64, error) {
	if err := checkDigest(digest); err != nil {
		return 0, err
	}
	fi, err := os.Stat(l.path(digest))
	if errors.Is(err, os.ErrNotExist) {
		return 0, failure.NotFound("content", digest)
	}
	if err != nil {
		return 0, fmt.Errorf("content %s: %w", digest, err)
	}
	return fi.Size(), nil
}

// Put implements Store. The file is renamed into place when it is on the
// same filesystem as the store (the usual case: uploads are staged under
// the same data directory), and copied otherwise; either way it is fsynced
// and appears under its digest whole or not at all.
func (l *Local) Put(ctx context.Context, digest, path string, size int64) error {
	if err := checkDigest(digest); err != nil {
		return err
	}
	if held, err := l.Stat(ctx, digest); err == nil {
		if held != size {
			return fmt.Errorf("content %s is held with %d bytes, not %d: the store is damaged", digest, held, size)
		}
		return os.Remove(path)
	}
	final := l.path(digest)
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return err
	}
	if err := syncFile(path); err != nil {
		return err
	}
	err := os.Rename(path, final)
	if errors.Is(err, syscall.EXDEV) {
		err = copyInto(path, final)
	}
	if err != nil {
		return fmt.Errorf("content %s: %w", digest, err)
	}
	return syncDir(filepath.Dir(final))
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func copyInto(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(tmp)
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		os.Remove(tmp)
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return os.Remove(src)
}

// ServeRead serves GET ReadPath+DIGEST from the directory (see
// signedReads.serve).
func (l *Local) ServeRead(w http.ResponseWriter, r *http.Request) {
	l.serve(w, r, func(digest string) (io.ReadSeekCloser, time.Time, error) {
		f, err := os.Open(l.path(digest))
		if errors.Is(err, os.ErrNotExist) {
			return nil, time.Time{}, failure.NotFound("content", digest)
		}
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("content %s: %w", digest, err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, time.Time{}, err
		}
		return f, fi.ModTime(), nil
	})
}
