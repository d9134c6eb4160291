package cli

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
)

func TestParseArtifactFlag(t *testing.T) {
	for in, want := range map[string]api.ArtifactMount{
		"data@v2:/data":               {Name: "data", Version: "v2", MountPath: "/data"},
		"weights:/m/w.bin":            {Name: "weights", MountPath: "/m/w.bin"},
		"data@v1:/d:min-read=500MB/s": {Name: "data", Version: "v1", MountPath: "/d", MinReadBytesPerSecond: 500_000_000},
		"data:/d:min-read=1GiB/s":     {Name: "data", MountPath: "/d", MinReadBytesPerSecond: 1 << 30},
	} {
		got, err := parseArtifactFlag(in)
		if err != nil || got != want {
			t.Errorf("parseArtifactFlag(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"data", ":/d", "data:relative", "data:/d:speed=1", "data:/d:min-read=fast"} {
		if _, err := parseArtifactFlag(bad); err == nil {
			t.Errorf("parseArtifactFlag(%q) accepted", bad)
		}
	}
}

// TestDirectoryArchiveIsDeterministic: the same tree makes the same bytes
// whatever its files' times, so pushing it again is the same version.
func TestDirectoryArchiveIsDeterministic(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "b", "c"), 0o755)
	os.WriteFile(filepath.Join(dir, "b", "c", "x.txt"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("a"), 0o600)
	var first, second bytes.Buffer
	if err := writeTree(dir, &first); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(dir, "a.txt"), later, later)
	if err := writeTree(dir, &second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.Bytes(), second.Bytes()) {
		t.Error("touching a file changed the archive")
	}
	p, err := dirPayload(dir)
	if err != nil || p.Size != int64(first.Len()) || p.Format != api.ArtifactTar {
		t.Fatalf("payload %+v, %v", p, err)
	}
	rc, _ := p.Open(100)
	rest := new(bytes.Buffer)
	rest.ReadFrom(rc)
	if !bytes.Equal(rest.Bytes(), first.Bytes()[100:]) {
		t.Error("Open(100) does not resume at byte 100")
	}
	os.Symlink("a.txt", filepath.Join(dir, "link"))
	if err := writeTree(dir, new(bytes.Buffer)); err == nil || !strings.Contains(err.Error(), "regular files and directories only") {
		t.Errorf("a symlink in the tree: %v", err)
	}
}

// TestPayloadsRefuseAChangedSource: a file or tree changed while it is
// pushed (or between a broken send and its resumption) is an error when
// it is read, not content pushed as a mixture.
func TestPayloadsRefuseAChangedSource(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.bin")
	os.WriteFile(p, bytes.Repeat([]byte("a"), 1000), 0o644)
	fi, _ := os.Stat(p)
	payload := client.FilePayload(p, fi)
	if payload.Size != 1000 || payload.SHA256 != "" || payload.Format != api.ArtifactFile {
		t.Fatalf("payload %+v", payload)
	}
	rc, err := payload.Open(10)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || len(got) != 990 {
		t.Fatalf("Open(10): %d bytes, %v", len(got), err)
	}
	// Rewritten in place, same size: refused at the end of a read already
	// open, and by the next Open.
	rc, _ = payload.Open(0)
	later := fi.ModTime().Add(time.Second)
	os.WriteFile(p, bytes.Repeat([]byte("b"), 1000), 0o644)
	os.Chtimes(p, later, later)
	if _, err := io.ReadAll(rc); err == nil || !strings.Contains(err.Error(), "changed while it was pushed") {
		t.Errorf("reading a file rewritten meanwhile: %v", err)
	}
	rc.Close()
	if _, err := payload.Open(500); err == nil || !strings.Contains(err.Error(), "changed while it was pushed") {
		t.Errorf("opening a rewritten file: %v", err)
	}

	tree := filepath.Join(dir, "tree")
	os.MkdirAll(tree, 0o755)
	os.WriteFile(filepath.Join(tree, "x"), []byte("x"), 0o644)
	tp, err := dirPayload(tree)
	if err != nil || tp.SHA256 != "" {
		t.Fatalf("dir payload %+v, %v", tp, err)
	}
	os.WriteFile(filepath.Join(tree, "y"), []byte("y"), 0o644)
	rc, _ = tp.Open(0)
	if _, err := io.ReadAll(rc); err == nil || !strings.Contains(err.Error(), "changed while it was pushed") {
		t.Errorf("reading a tree changed meanwhile: %v", err)
	}
}
