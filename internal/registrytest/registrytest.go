// Package registrytest runs an OCI distribution registry on loopback, so
// tests (and `mercator dev`) can push images and pull them back by manifest
// digest without the internet.
//
// It is go-containerregistry's in-process registry (pkg/registry), served
// over plain HTTP. That works with a stock Docker daemon because the daemon
// treats any registry on 127.0.0.0/8 as insecure without configuration; a
// registry on any other address would need the daemon's
// insecure-registries setting, which is why both entry points insist on
// loopback.
//
// StartBearer runs one guarded as Docker Hub, ghcr.io and Harbor guard
// theirs: a token endpoint issues short-lived signed tokens for a Basic
// credential, and the registry serves only requests bearing one that
// covers them (BearerRegistry).
//
// Importers: tests of the node agent and the end-to-end suite (Start), and
// the dev command (Serve). Nothing in a production path imports it.
package registrytest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

// Start runs a registry on 127.0.0.1 with a free port for the rest of the
// test and returns its host ("127.0.0.1:PORT"), the part an image reference
// starts with: host + "/workload:1". Content is held in memory and vanishes
// when the test ends, which t.Cleanup arranges. A failure to listen fails
// the test.
func Start(t testing.TB) string {
	t.Helper()
	host, closeFn, err := Serve(context.Background(), "127.0.0.1:0", "")
	if err != nil {
		t.Fatalf("registrytest: %v", err)
	}
	t.Cleanup(func() { cleanupClose(t, closeFn) })
	return host
}

// cleanupClose stops a registry at the end of a test.
func cleanupClose(t testing.TB, closeFn func() error) {
	err := closeFn()
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		// A client (the Docker daemon's pooled connection) still held a
		// request after five seconds; the server was closed forcibly,
		// which is all a test's cleanup needs.
		t.Logf("registrytest: closed forcibly: %v", err)
	case err != nil:
		t.Errorf("registrytest: close: %v", err)
	}
}

// Serve runs a registry on addr until ctx ends or closeFn is called, and
// returns the host it listens on ("127.0.0.1:PORT"; useful when addr asks
// for port 0). addr must be a loopback address, for the reason in the
// package doc; anything else is refused.
//
// blobDir, when not empty, is a directory that holds layer and config blobs
// so large images do not live in this process's memory; manifests are
// always in memory, so a restarted registry holds no images either way.
//
// closeFn stops the listener and waits up to five seconds for requests in
// flight; it is safe to call more than once. The registry's request log is
// discarded.
func Serve(ctx context.Context, addr, blobDir string) (host string, closeFn func() error, err error) {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", nil, fmt.Errorf("registry address %q: %w", addr, err)
	}
	if ip := net.ParseIP(h); ip == nil || !ip.IsLoopback() {
		return "", nil, fmt.Errorf("registry address %q: want a loopback IP (127.0.0.0/8), which Docker accepts over plain HTTP", addr)
	}
	opts := []registry.Option{registry.Logger(log.New(io.Discard, "", 0))}
	if blobDir != "" {
		opts = append(opts, registry.WithBlobHandler(registry.NewDiskBlobHandler(blobDir)))
	}
	return serveHandler(ctx, addr, registry.New(opts...))
}

// serveHandler serves h on addr as Serve describes.
func serveHandler(ctx context.Context, addr string, h http.Handler) (host string, closeFn func() error, err error) {
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("registry listen on %s: %w", addr, err)
	}
	server := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() {
		// ErrServerClosed is the normal end; anything else means the listener
		// broke, which the next pull or push will report in its own words.
		_ = server.Serve(listener)
	}()
	stopped := make(chan struct{})
	var (
		once     sync.Once
		closeErr error
	)
	closeFn = func() error {
		once.Do(func() {
			shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := server.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
				closeErr = err
				_ = server.Close()
			}
			close(stopped)
		})
		return closeErr
	}
	go func() {
		select {
		case <-ctx.Done():
			_ = closeFn()
		case <-stopped:
		}
	}()
	return listener.Addr().String(), closeFn, nil
}
