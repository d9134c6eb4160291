package artifactcache

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// seedTar builds a tar archive from headers and their contents, for seeds.
func seedTar(t testing.TB, entries ...any) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(entries); i += 2 {
		h := entries[i].(*tar.Header)
		body := entries[i+1].(string)
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sparseTar is a PAX (format 1.0) sparse entry: one byte of data at the
// end of a file of size bytes, in under 3 KiB of archive. Go's tar.Writer
// will not write one, so its blocks are laid out here by hand.
func sparseTar(t testing.TB, size int64) []byte {
	block := func(name string, flag byte, n int) []byte {
		h := make([]byte, 512)
		copy(h, name)
		copy(h[100:], "0000644\x00")
		copy(h[108:], "0000000\x00")
		copy(h[116:], "0000000\x00")
		copy(h[124:], fmt.Sprintf("%011o\x00", n))
		copy(h[136:], "00000000000\x00")
		copy(h[148:], "        ")
		h[156] = flag
		copy(h[257:], "ustar\x0000")
		sum := 0
		for _, b := range h {
			sum += int(b)
		}
		copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
		return h
	}
	pad := func(b []byte) []byte { return append(b, make([]byte, (512-len(b)%512)%512)...) }
	record := func(kv string) string {
		n := len(kv) + 3
		for len(fmt.Sprintf("%d %s\n", n, kv)) != n {
			n++
		}
		return fmt.Sprintf("%d %s\n", n, kv)
	}
	var pax string
	for _, kv := range []string{"GNU.sparse.major=1", "GNU.sparse.minor=0", "GNU.sparse.name=big", fmt.Sprintf("GNU.sparse.realsize=%d", size)} {
		pax += record(kv)
	}
	sparseMap := pad([]byte(fmt.Sprintf("1\n%d\n1\n", size-1)))
	var out []byte
	out = append(out, block("PaxHeaders/big", 'x', len(pax))...)
	out = append(out, pad([]byte(pax))...)
	out = append(out, block("big", '0', len(sparseMap)+1)...)
	out = append(out, pad(append(sparseMap, 'x'))...)
	return append(out, make([]byte, 1024)...)
}

// FuzzExtractTar feeds arbitrary bytes to the node's tar extraction, the
// decoder of an Artifact version's content (which a user uploaded). It
// must never panic, never write outside its directory, never write a file
// that is not regular or a directory, and never write more bytes than
// the archive holds (a sparse entry would: 10 KiB of headers can describe
// a file of terabytes).
func FuzzExtractTar(f *testing.F) {
	f.Add(seedTar(f, &tar.Header{Name: "a/", Typeflag: tar.TypeDir, Mode: 0o755}, "",
		&tar.Header{Name: "a/b.txt", Typeflag: tar.TypeReg, Mode: 0o644}, "hello"))
	f.Add(seedTar(f, &tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}, "x"))
	f.Add(seedTar(f, &tar.Header{Name: "/abs", Typeflag: tar.TypeReg, Mode: 0o644}, "x"))
	f.Add(seedTar(f, &tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}, ""))
	f.Add(seedTar(f, &tar.Header{Name: "setuid", Typeflag: tar.TypeReg, Mode: 0o4755}, "x"))
	f.Add(sparseTar(f, 512<<20))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, archive []byte) {
		root := t.TempDir()
		dir := filepath.Join(root, "content")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		_ = extractTar(bytes.NewReader(archive), dir) // refusals are fine; what landed is checked
		var written int64
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p == root {
				return nil
			}
			rel, _ := filepath.Rel(dir, p)
			if rel == ".." || filepath.IsAbs(rel) || len(rel) > 2 && rel[:3] == "../" {
				t.Fatalf("%s was written outside the artifact's directory", p)
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			switch {
			case info.Mode().IsRegular():
				written += info.Size()
				if info.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
					t.Fatalf("%s kept a setuid or setgid bit", p)
				}
			case info.IsDir():
			default:
				t.Fatalf("%s is a %v; only regular files and directories may land", p, info.Mode().Type())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if written > int64(len(archive)) {
			t.Fatalf("%d bytes of archive wrote %d bytes of files", len(archive), written)
		}
	})
}
