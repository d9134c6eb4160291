package artifactcache

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

func hexDigest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// contentServer serves named blobs; serve may replace what one request
// gets (to corrupt it, or to hold it).
type contentServer struct {
	*httptest.Server
	mu       sync.Mutex
	blobs    map[string][]byte
	requests atomic.Int32
	serve    func(n int32, w http.ResponseWriter, blob []byte) bool // true: handled
}

func newContentServer(t *testing.T) *contentServer {
	cs := &contentServer{blobs: map[string][]byte{}}
	cs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := cs.requests.Add(1)
		cs.mu.Lock()
		blob, ok := cs.blobs[strings.TrimPrefix(r.URL.Path, "/")]
		serve := cs.serve
		cs.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		if serve != nil && serve(n, w, blob) {
			return
		}
		w.Write(blob)
	}))
	t.Cleanup(cs.Close)
	return cs
}

func (cs *contentServer) add(name string, blob []byte, format string) nodeproto.PrepareArtifactCommand {
	cs.mu.Lock()
	cs.blobs[name] = blob
	cs.mu.Unlock()
	return nodeproto.PrepareArtifactCommand{Name: name, Version: "v1", SHA256: hexDigest(blob), Size: int64(len(blob)), Format: format,
		URL: cs.URL + "/" + name + "?sig=secret-signature", ExpiresAt: time.Now().Add(time.Hour)}
}

// tmpEntries lists the cache's tmp directory, failing the test on an
// error (a missing directory lists as empty).
func tmpEntries(t *testing.T, root string) []os.DirEntry {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, "tmp"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return entries
}

func newTestStore(t *testing.T, opts Options, inUse map[string]bool) (*Cache, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "artifacts")
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Cache{opts: opts, inUse: func(context.Context) (map[string]bool, error) { return inUse, nil }}
	if err := s.init(root); err != nil {
		t.Fatal(err)
	}
	return s, root
}

func TestPrepareFetchesVerifiesAndPublishes(t *testing.T) {
	cs := newContentServer(t)
	blob := bytes.Repeat([]byte("0123456789abcdef"), 200_000) // 3.2 MB: several pieces
	cmd := cs.add("data", blob, "file")
	s, root := newTestStore(t, Options{MinLinkSample: -1}, nil)
	if err := s.prepare(context.Background(), cmd); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(root, "sha256", cmd.SHA256, "content"))
	if err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("published copy: %d bytes, %v; want the blob", len(got), err)
	}
	if entries := tmpEntries(t, root); len(entries) != 0 {
		t.Errorf("tmp holds %d entries after a copy", len(entries))
	}
	// Held: a second prepare, under another name, fetches nothing.
	again := cmd
	again.Name = "alias"
	if err := s.prepare(context.Background(), again); err != nil || cs.requests.Load() != 1 {
		t.Fatalf("second prepare: %v, %d requests; want none more", err, cs.requests.Load())
	}
	// Held content needs no read: a command without one is fine then.
	unminted := cmd
	unminted.URL, unminted.ExpiresAt = "", time.Time{}
	if err := s.prepare(context.Background(), unminted); err != nil || cs.requests.Load() != 1 {
		t.Fatalf("prepare of held content without a read: %v, %d requests", err, cs.requests.Load())
	}
	var facts nodeproto.NodeFacts
	s.describe(&facts)
	if len(facts.Artifacts) != 1 || facts.Artifacts[0].SHA256 != cmd.SHA256 || strings.Join(facts.Artifacts[0].Refs, ",") != "alias@v1,data@v1" {
		t.Errorf("inventory = %+v", facts.Artifacts)
	}
	if facts.Link == nil || facts.Link.Source != CopySource || facts.Link.Confidence != MeasuredLinkConfidence ||
		facts.Link.Bytes != int64(len(blob)) || facts.Link.BytesPerSecond <= 0 {
		t.Errorf("link reading = %+v", facts.Link)
	}
	// A restarted agent finds the copy and forgets the reading.
	s2 := &Cache{inUse: s.inUse}
	if err := s2.init(root); err != nil {
		t.Fatal(err)
	}
	var after nodeproto.NodeFacts
	s2.describe(&after)
	if len(after.Artifacts) != 1 || after.Link != nil {
		t.Errorf("after restart: inventory %+v, link %+v", after.Artifacts, after.Link)
	}
}

func TestPrepareRefusesWithoutAMintedRead(t *testing.T) {
	cs := newContentServer(t)
	cmd := cs.add("data", []byte("content"), "file")
	s, _ := newTestStore(t, Options{}, nil)
	none := cmd
	none.URL = ""
	err := s.prepare(context.Background(), none)
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "no minted read") {
		t.Errorf("command without a URL: %v, want ErrInvalid saying there is no minted read", err)
	}
	expired := cmd
	expired.ExpiresAt = time.Now().Add(-time.Second)
	err = s.prepare(context.Background(), expired)
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired read: %v, want ErrInvalid saying it expired", err)
	}
	if n := cs.requests.Load(); n != 0 {
		t.Errorf("%d requests were made for refused commands", n)
	}
}

func TestPrepareRetriesCorruptContent(t *testing.T) {
	cs := newContentServer(t)
	blob := []byte(strings.Repeat("exact content ", 1000))
	cmd := cs.add("data", blob, "file")
	cs.serve = func(n int32, w http.ResponseWriter, blob []byte) bool {
		if n == 1 {
			bad := bytes.Clone(blob)
			bad[100] ^= 0xff
			w.Write(bad)
			return true
		}
		return false
	}
	s, root := newTestStore(t, Options{}, nil)
	if err := s.prepare(context.Background(), cmd); err != nil {
		t.Fatalf("prepare after one corrupt transfer: %v", err)
	}
	if cs.requests.Load() != 2 {
		t.Errorf("%d requests, want 2 (the corrupt one and its retry)", cs.requests.Load())
	}
	if got, err := os.ReadFile(filepath.Join(root, "sha256", cmd.SHA256, "content")); err != nil || !bytes.Equal(got, blob) {
		t.Errorf("the published copy is not the content (%v)", err)
	}

	// Always wrong (too long, then truncated, then flipped): refused after
	// fetchAttempts, nothing published, nothing left in tmp.
	cmd2 := cs.add("other", []byte(strings.Repeat("other ", 1000)), "file")
	cs.serve = func(n int32, w http.ResponseWriter, blob []byte) bool {
		switch n % 3 {
		case 0:
			w.Write(append(bytes.Clone(blob), 'x'))
		case 1:
			w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
			w.Write(blob[:len(blob)/2]) // the server hangs up early
		default:
			bad := bytes.Clone(blob)
			bad[0] ^= 1
			w.Write(bad)
		}
		return true
	}
	before := cs.requests.Load()
	err := s.prepare(context.Background(), cmd2)
	if err == nil || !strings.Contains(err.Error(), "gave up after 3 attempts") {
		t.Fatalf("always-corrupt content: %v", err)
	}
	if strings.Contains(err.Error(), "secret-signature") {
		t.Errorf("the error repeats the minted read's signature: %v", err)
	}
	if n := cs.requests.Load() - before; n != fetchAttempts {
		t.Errorf("%d requests, want %d", n, fetchAttempts)
	}
	if _, err := os.Stat(filepath.Join(root, "sha256", cmd2.SHA256)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a copy of corrupt content was published (%v)", err)
	}
	if entries := tmpEntries(t, root); len(entries) != 0 {
		t.Errorf("tmp holds %d entries after failed copies", len(entries))
	}
}

func TestPrepareRefusalIsNotRetried(t *testing.T) {
	cs := newContentServer(t)
	cmd := cs.add("data", []byte("content"), "file")
	cs.serve = func(n int32, w http.ResponseWriter, blob []byte) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"error":{"code":"unauthorized","message":"this content read expired"}}`))
		return true
	}
	s, _ := newTestStore(t, Options{}, nil)
	err := s.prepare(context.Background(), cmd)
	if !errors.Is(err, failure.ErrUnauthorized) || !strings.Contains(err.Error(), "this content read expired") || cs.requests.Load() != 1 {
		t.Fatalf("refused read: %v after %d requests; want ErrUnauthorized with the server's words, once", err, cs.requests.Load())
	}
}

func TestConcurrentPreparesShareOneCopy(t *testing.T) {
	cs := newContentServer(t)
	cmd := cs.add("data", bytes.Repeat([]byte("x"), 1<<20), "file")
	release := make(chan struct{})
	cs.serve = func(n int32, w http.ResponseWriter, blob []byte) bool {
		<-release
		return false
	}
	s, _ := newTestStore(t, Options{}, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := range 5 {
		c := cmd
		c.Name = fmt.Sprintf("name%d", i)
		wg.Add(1)
		go func() { defer wg.Done(); errs <- s.prepare(context.Background(), c) }()
	}
	time.Sleep(100 * time.Millisecond)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := cs.requests.Load(); n != 1 {
		t.Errorf("%d fetches for 5 concurrent prepares, want 1", n)
	}
	var facts nodeproto.NodeFacts
	s.describe(&facts)
	if len(facts.Artifacts) != 1 || len(facts.Artifacts[0].Refs) != 5 {
		t.Errorf("inventory = %+v, want one copy with five references", facts.Artifacts)
	}
}

func TestBudgetEvictsLeastRecentlyUsedNotInUse(t *testing.T) {
	cs := newContentServer(t)
	mk := func(name string) nodeproto.PrepareArtifactCommand {
		return cs.add(name, bytes.Repeat([]byte(name[:1]), 1000), "file")
	}
	a, b, c, d := mk("a"), mk("b"), mk("c"), mk("d")
	now := time.Now()
	clock := func() time.Time { return now }
	inUse := map[string]bool{}
	s, root := newTestStore(t, Options{Budget: 2500, Now: clock}, inUse)
	prep := func(cmd nodeproto.PrepareArtifactCommand) error {
		now = now.Add(time.Minute)
		return s.prepare(context.Background(), cmd)
	}
	for _, cmd := range []nodeproto.PrepareArtifactCommand{a, b} {
		if err := prep(cmd); err != nil {
			t.Fatal(err)
		}
	}
	if err := prep(a); err != nil { // a is now the more recently used
		t.Fatal(err)
	}
	if err := prep(c); err != nil { // evicts b
		t.Fatal(err)
	}
	held := func() string {
		var facts nodeproto.NodeFacts
		s.describe(&facts)
		var names []string
		for _, h := range facts.Artifacts {
			names = append(names, strings.Split(h.Refs[0], "@")[0])
		}
		return strings.Join(names, ",")
	}
	if got := held(); !sameSet(got, "a,c") {
		t.Fatalf("held %s after the third copy, want a and c (b least recently used)", got)
	}
	// Work uses both: nothing may go, and the copy is refused whole.
	inUse[a.SHA256], inUse[c.SHA256] = true, true
	err := prep(d)
	if !errors.Is(err, failure.ErrConflict) || !strings.Contains(err.Error(), "do not fit") || !strings.Contains(err.Error(), "nothing was written") {
		t.Fatalf("prepare over budget: %v", err)
	}
	if got := held(); !sameSet(got, "a,c") {
		t.Errorf("held %s after a refused copy, want a and c", got)
	}
	if entries := tmpEntries(t, root); len(entries) != 0 {
		t.Errorf("tmp holds %d entries", len(entries))
	}
	// A launch's pin protects as well as a container.
	delete(inUse, a.SHA256)
	s.mu.Lock()
	s.pins[a.SHA256] = 1
	s.mu.Unlock()
	if err := prep(d); !errors.Is(err, failure.ErrConflict) {
		t.Fatalf("prepare with a pinned copy: %v", err)
	}
	s.mu.Lock()
	delete(s.pins, a.SHA256)
	s.mu.Unlock()
	if err := prep(d); err != nil {
		t.Fatal(err)
	}
	if got := held(); !sameSet(got, "c,d") {
		t.Errorf("held %s, want c (in use) and d", got)
	}
	// A version larger than the whole budget is refused at once.
	big := cs.add("big", bytes.Repeat([]byte("B"), 3000), "file")
	if err := prep(big); !errors.Is(err, failure.ErrConflict) || !strings.Contains(err.Error(), "artifact budget") {
		t.Errorf("version larger than the budget: %v", err)
	}
}

func sameSet(got, want string) bool {
	g, w := strings.Split(got, ","), strings.Split(want, ",")
	if len(g) != len(w) {
		return false
	}
	m := map[string]bool{}
	for _, x := range g {
		m[x] = true
	}
	for _, x := range w {
		if !m[x] {
			return false
		}
	}
	return true
}

func tarOf(t *testing.T, entries ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bytes.Repeat([]byte("t"), int(h.Size))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestTarVersions(t *testing.T) {
	cs := newContentServer(t)
	good := cs.add("tree", tarOf(t,
		&tar.Header{Name: "sub/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "sub/a.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5},
		&tar.Header{Name: "b.bin", Typeflag: tar.TypeReg, Mode: 0o755, Size: 70000},
	), "tar")
	s, root := newTestStore(t, Options{}, nil)
	if err := s.prepare(context.Background(), good); err != nil {
		t.Fatal(err)
	}
	content := filepath.Join(root, "sha256", good.SHA256, "content")
	if got, err := os.ReadFile(filepath.Join(content, "sub", "a.txt")); err != nil || string(got) != "ttttt" {
		t.Errorf("sub/a.txt = %q, %v", got, err)
	}
	if fi, err := os.Stat(filepath.Join(content, "b.bin")); err != nil || fi.Size() != 70000 {
		t.Errorf("b.bin: %v", err)
	}
	for name, blob := range map[string][]byte{
		"climbs": tarOf(t, &tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}),
		"link":   tarOf(t, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}),
	} {
		cmd := cs.add(name, blob, "tar")
		err := s.prepare(context.Background(), cmd)
		if err == nil || !strings.Contains(err.Error(), "not a valid tar") {
			t.Errorf("%s: %v, want a refusal of the content", name, err)
		}
		if _, err := os.Stat(filepath.Join(root, "sha256", cmd.SHA256)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: published", name)
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(root), "escape")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a tar entry escaped the artifact root")
	}
}

func TestLinkFloorIsTheSlowestValidReading(t *testing.T) {
	now := time.Now()
	s, _ := newTestStore(t, Options{Now: func() time.Time { return now }}, nil)
	big := nodeproto.PrepareArtifactCommand{Size: 100 << 20}
	s.record(big, time.Second) // 100 MiB/s, at t0
	now = now.Add(10 * time.Minute)
	s.record(big, time.Second/4)                                         // 400 MiB/s
	s.record(nodeproto.PrepareArtifactCommand{Size: 1 << 20}, time.Hour) // too small to count
	var facts nodeproto.NodeFacts
	s.describe(&facts)
	if facts.Link == nil || facts.Link.BytesPerSecond != 100<<20 {
		t.Fatalf("floor = %+v, want the 100 MiB/s reading", facts.Link)
	}
	// The slow reading expires an hour after it was taken; the fast one
	// stands until its own hour is over.
	now = now.Add(MeasuredLinkValidity - 5*time.Minute)
	facts = nodeproto.NodeFacts{}
	s.describe(&facts)
	if facts.Link == nil || facts.Link.BytesPerSecond != 400<<20 {
		t.Fatalf("floor after the slow reading expired = %+v, want the 400 MiB/s reading", facts.Link)
	}
	now = now.Add(10 * time.Minute)
	facts = nodeproto.NodeFacts{}
	s.describe(&facts)
	if facts.Link != nil {
		t.Fatalf("floor after every reading expired = %+v, want none", facts.Link)
	}
}

func TestFullDiskIsAClearErrorAndNoCopy(t *testing.T) {
	// A sink that fails as a full disk does, halfway.
	blob := bytes.Repeat([]byte("z"), 3<<20)
	sink := &failingSink{after: 1 << 20}
	_, _, err := pipeline(bytes.NewReader(blob), sink, int64(len(blob)))
	if !errors.Is(err, errNoSpace) || !sink.aborted {
		t.Fatalf("pipeline over a full disk: %v (aborted %v)", err, sink.aborted)
	}
	err = diskError("data@v1", int64(len(blob)), err)
	if !errors.Is(err, failure.ErrConflict) || !strings.Contains(err.Error(), "disk holding the artifact root is full") {
		t.Errorf("diskError = %v", err)
	}
}

var errNoSpace = &os.PathError{Op: "write", Path: "content", Err: errENOSPC}

type failingSink struct {
	written int
	after   int
	aborted bool
}

func (f *failingSink) Write(p []byte) (int, error) {
	if f.written+len(p) > f.after {
		return 0, &sinkError{err: errNoSpace, disk: true}
	}
	f.written += len(p)
	return len(p), nil
}
func (f *failingSink) finish() error { return nil }
func (f *failingSink) abort()        { f.aborted = true }

var errENOSPC = syscallENOSPC()
