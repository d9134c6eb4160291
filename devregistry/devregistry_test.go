package devregistry

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/mercator/mercator/internal/logbuffer"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/imageref"
)

func start(t *testing.T, dir string, logs *logbuffer.Buffer) *Registry {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r, err := Start(t.Context(), "127.0.0.1:0", dir, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(t.Context()) })
	return r
}

func TestPushSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	logs := &logbuffer.Buffer{}
	r := start(t, dir, logs)

	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	tagged, err := name.ParseReference(r.Addr()+"/team/hello:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tagged, img); err != nil {
		t.Fatalf("push: %v", err)
	}
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// Same directory, new process-level instance, most likely a new port.
	r2 := start(t, dir, logs)
	tagged, err = name.ParseReference(r2.Addr()+"/team/hello:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(tagged)
	if err != nil {
		t.Fatalf("HEAD by tag after restart: %v", err)
	}
	if desc.Digest != want {
		t.Fatalf("tag names %s after restart, want %s", desc.Digest, want)
	}
	pinned, err := name.ParseReference(r2.Addr()+"/team/hello@"+want.String(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(pinned)
	if err != nil {
		t.Fatalf("GET by digest after restart: %v", err)
	}
	readAll(t, got)

	// The resolver the control plane uses pins the tag against this registry.
	var res imageref.Resolver
	ref, err := imageref.Parse(r2.Addr() + "/team/hello:1")
	if err != nil {
		t.Fatal(err)
	}
	p, err := res.Resolve(t.Context(), ref)
	if err != nil || p.Digest() != want.String() {
		t.Fatalf("Resolve = %v, %v; want digest %s", p, err, want)
	}

	// A missing tag is routine: it must not log at Info or above.
	missing, _ := imageref.Parse(r2.Addr() + "/team/hello:nope")
	if _, err := res.Resolve(t.Context(), missing); !errors.Is(err, failure.ErrInvalid) {
		t.Fatalf("Resolve(missing) = %v, want kind invalid", err)
	}
	if err := r2.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !strings.Contains(line, "development registry serving") {
			t.Errorf("unexpected log line: %s", line)
		}
	}
}

func TestStartRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "10.0.0.1:5000", "example.com:5000", "nonsense"} {
		r, err := Start(t.Context(), addr, t.TempDir(), nil)
		if err == nil {
			_ = r.Close(t.Context())
			t.Errorf("Start(%q) succeeded, want an error", addr)
			continue
		}
		if !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("Start(%q) = %v, want kind invalid", addr, err)
		}
	}
}

func TestStartPortInUse(t *testing.T) {
	r := start(t, t.TempDir(), &logbuffer.Buffer{})
	if r2, err := Start(t.Context(), r.Addr(), t.TempDir(), nil); err == nil {
		_ = r2.Close(t.Context())
		t.Fatalf("second Start on %s succeeded", r.Addr())
	}
}

// readAll reads img's config and every layer; go-containerregistry checks
// each blob against its digest as it reads.
func readAll(t *testing.T, img v1.Image) {
	t.Helper()
	if _, err := img.RawConfigFile(); err != nil {
		t.Fatalf("config: %v", err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 {
		t.Fatalf("%d layers, want 2", len(layers))
	}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, rc); err != nil {
			t.Fatalf("layer: %v", err)
		}
		if err := rc.Close(); err != nil {
			t.Fatalf("layer: %v", err)
		}
	}
}
