package artifactcache

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mercator/mercator/nodeproto"
)

// TestStartClearsWhatACrashLeft: an agent that starts on an artifact root
// a crashed agent left keeps the copies it had published (their content,
// and no fetch to prepare them again) and removes everything else: copies
// in progress under tmp, and whatever under sha256 it could mistake for a
// verified copy (no meta.json, an unreadable one, a name that is no
// digest).
func TestStartClearsWhatACrashLeft(t *testing.T) {
	cs := newContentServer(t)
	blob := []byte(strings.Repeat("published ", 1000))
	cmd := cs.add("data", blob, "file")
	first, root := newTestStore(t, Options{}, nil)
	if err := first.prepare(context.Background(), cmd); err != nil {
		t.Fatal(err)
	}
	// The crash's leftovers.
	partial := hexDigest([]byte("partial"))
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	meta, err := os.ReadFile(filepath.Join(root, "sha256", cmd.SHA256, "meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	write("tmp/copy-123", "half a copy")
	write("tmp/copy-456/content", "half a tar")
	write("sha256/"+partial+"/content", "renamed, never described")
	write("sha256/"+hexDigest([]byte("garbled"))+"/content", "x")
	write("sha256/"+hexDigest([]byte("garbled"))+"/meta.json", "{not json")
	write("sha256/not-a-digest/content", "x")
	write("sha256/not-a-digest/meta.json", string(meta))

	// The agent starts again: New, then its first use.
	restarted := New(root, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, func(context.Context) (map[string]bool, error) { return nil, nil })
	var facts nodeproto.NodeFacts
	restarted.Describe(&facts)
	if len(facts.Artifacts) != 1 || facts.Artifacts[0].SHA256 != cmd.SHA256 {
		t.Fatalf("inventory after the restart = %+v, want the published copy alone", facts.Artifacts)
	}
	if entries := tmpEntries(t, root); len(entries) != 0 {
		t.Errorf("tmp still holds %d entries of copies in progress", len(entries))
	}
	entries, err := os.ReadDir(filepath.Join(root, "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != cmd.SHA256 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("sha256 holds %v, want only %s", names, cmd.SHA256)
	}
	got, err := os.ReadFile(restarted.Path(cmd.SHA256))
	if err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("the published copy after the restart: %d bytes, %v", len(got), err)
	}
	before := cs.requests.Load()
	if err := restarted.Prepare(context.Background(), cmd); err != nil || cs.requests.Load() != before {
		t.Fatalf("prepare of the published copy after the restart: %v, %d fetches; want none", err, cs.requests.Load()-before)
	}
}
