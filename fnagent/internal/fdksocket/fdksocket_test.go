package fdksocket

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// listenIn listens on a unix socket named name in dir and serves h.
func listenIn(t *testing.T, dir, name string, h http.HandlerFunc) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

func TestDialFollowsPhonyLinksInsideTheDirectoryOnly(t *testing.T) {
	ok := func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.WriteString(w, "ok"); err != nil {
			t.Error(err)
		}
	}
	cases := []struct {
		name   string
		setup  func(dir string) error
		wantOK bool
	}{
		{"socket itself", func(dir string) error { listenIn(t, dir, Name, ok); return nil }, true},
		{"relative link to phony (fdk-go)", func(dir string) error {
			listenIn(t, dir, "phonylsnr.sock", ok)
			return os.Symlink("phonylsnr.sock", filepath.Join(dir, Name))
		}, true},
		{"absolute link inside the container's /tmp/iofs", func(dir string) error {
			listenIn(t, dir, "phonylsnr.sock", ok)
			return os.Symlink("/tmp/iofs/phonylsnr.sock", filepath.Join(dir, Name))
		}, true},
		{"absolute link elsewhere", func(dir string) error {
			outside := t.TempDir()
			listenIn(t, outside, "x.sock", ok)
			return os.Symlink(filepath.Join(outside, "x.sock"), filepath.Join(dir, Name))
		}, false},
		{"relative link climbing out", func(dir string) error {
			listenIn(t, filepath.Dir(dir), "up.sock", ok)
			return os.Symlink("../up.sock", filepath.Join(dir, Name))
		}, false},
		{"link to a link", func(dir string) error {
			outside := t.TempDir()
			listenIn(t, outside, "x.sock", ok)
			if err := os.Symlink(filepath.Join(outside, "x.sock"), filepath.Join(dir, "hop")); err != nil {
				return err
			}
			return os.Symlink("hop", filepath.Join(dir, Name))
		}, false},
		{"regular file", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, Name), []byte("x"), 0o644)
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "iofs")
			if err := os.Mkdir(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := c.setup(dir); err != nil {
				t.Fatal(err)
			}
			conn, err := Dial(context.Background(), dir)
			if c.wantOK != (err == nil) {
				t.Fatalf("Dial: %v; want ok=%v", err, c.wantOK)
			}
			if conn != nil {
				conn.Close()
			}
		})
	}
}

func TestWait(t *testing.T) {
	dir := t.TempDir()
	exited := make(chan struct{})
	go func() {
		time.Sleep(30 * time.Millisecond)
		listenIn(t, dir, "phonylsnr.sock", func(w http.ResponseWriter, r *http.Request) {})
		if err := os.Symlink("phonylsnr.sock", filepath.Join(dir, Name)); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := Wait(ctx, dir, exited); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	close(exited)
	if err := Wait(ctx, t.TempDir(), exited); !errors.Is(err, ErrExited) {
		t.Fatalf("exited container: %v", err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if err := Wait(short, t.TempDir(), make(chan struct{})); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no socket: %v", err)
	}
}
