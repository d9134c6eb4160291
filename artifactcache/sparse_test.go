package artifactcache

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// sparseReal is how large the crafted sparse files claim to be once their
// holes are filled: 512 MiB, from an archive of a few KiB.
const sparseReal = 512 << 20

// patchHeader rewrites the typeflag of the header block at offset in an
// archive, lets more change the block, and recomputes its checksum, which
// is how the tests write what archive/tar's writer refuses to (a PAX 'x'
// header carrying GNU.sparse records, an old GNU 'S' entry).
func patchHeader(archive []byte, offset int, typeflag byte, more func(block []byte)) {
	block := archive[offset : offset+512]
	block[156] = typeflag
	if more != nil {
		more(block)
	}
	copy(block[148:156], "        ")
	sum := 0
	for _, b := range block {
		sum += int(b)
	}
	copy(block[148:156], fmt.Sprintf("%06o\x00 ", sum))
}

// paxRecord is one "LEN KEY=VALUE\n" record, LEN counting itself.
func paxRecord(k, v string) string {
	body := " " + k + "=" + v + "\n"
	n := len(body) + 1
	for len(fmt.Sprint(n))+len(body) != n {
		n++
	}
	return fmt.Sprint(n) + body
}

// paxSparseTar is a GNU PAX sparse file (format 0.1, as `tar --sparse
// --format=posix` writes it): a PAX header whose GNU.sparse records say
// the file is sparseReal bytes with one 512-byte block of data at its end,
// then that block.
func paxSparseTar(t *testing.T) []byte {
	records := paxRecord("GNU.sparse.major", "0") + paxRecord("GNU.sparse.minor", "1") +
		paxRecord("GNU.sparse.name", "big.bin") + paxRecord("GNU.sparse.realsize", fmt.Sprint(sparseReal)) +
		paxRecord("GNU.sparse.numblocks", "1") + paxRecord("GNU.sparse.map", fmt.Sprintf("%d,512", sparseReal-512))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	write := func(h *tar.Header, data []byte) {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	write(&tar.Header{Name: "PaxHeaders/big.bin", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(records)), Format: tar.FormatUSTAR}, []byte(records))
	write(&tar.Header{Name: "GNUSparseFile.0/big.bin", Typeflag: tar.TypeReg, Mode: 0o644, Size: 512, Format: tar.FormatUSTAR}, bytes.Repeat([]byte("s"), 512))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	archive := buf.Bytes()
	patchHeader(archive, 0, tar.TypeXHeader, nil)
	return archive
}

// oldGNUSparseTar is an old GNU sparse entry (type 'S'): its header's
// sparse map puts 512 bytes of data at the end of a sparseReal-byte file.
func oldGNUSparseTar(t *testing.T) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "big.bin", Typeflag: tar.TypeReg, Mode: 0o644, Size: 512, Format: tar.FormatGNU}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(bytes.Repeat([]byte("s"), 512)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	archive := buf.Bytes()
	patchHeader(archive, 0, tar.TypeGNUSparse, func(block []byte) {
		copy(block[386:398], fmt.Sprintf("%011o\x00", sparseReal-512)) // first entry's offset
		copy(block[398:410], fmt.Sprintf("%011o\x00", 512))            // and length
		copy(block[483:495], fmt.Sprintf("%011o\x00", sparseReal))     // the real size
	})
	return archive
}

// diskUsage is what the files under root take on disk, in bytes.
func diskUsage(t *testing.T, root string) int64 {
	var total int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return total
}

// TestSparseEntriesAreRefused: a tar holding a sparse file, in either of
// the forms the tar reader would expand, is refused as invalid content,
// saying what it is, before a byte of the file is written; nothing is
// published and the cache holds what it held. Before the refusal, each of
// these few-KiB archives became a 512 MiB file.
func TestSparseEntriesAreRefused(t *testing.T) {
	cs := newContentServer(t)
	s, root := newTestStore(t, Options{Budget: 1 << 20}, nil)
	for name, archive := range map[string][]byte{"pax": paxSparseTar(t), "oldgnu": oldGNUSparseTar(t)} {
		t.Run(name, func(t *testing.T) {
			// The archive is what the tests say it is: the reader sees a
			// sparse entry of sparseReal bytes.
			h, err := tar.NewReader(bytes.NewReader(archive)).Next()
			if err != nil || h.Size != sparseReal || !isSparse(h) {
				t.Fatalf("crafted archive reads as %+v, %v; want a sparse entry of %d bytes", h, err, sparseReal)
			}
			cmd := cs.add(name, archive, "tar")
			err = s.prepare(context.Background(), cmd)
			if err == nil || !strings.Contains(err.Error(), "not a valid tar") || !strings.Contains(err.Error(), "is a sparse file of 536870912 bytes") {
				t.Fatalf("prepare of a %d-byte sparse tar = %v, want a refusal naming the sparse file", len(archive), err)
			}
			if _, err := os.Stat(filepath.Join(root, "sha256", cmd.SHA256)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the sparse tar was published: %v", err)
			}
			if n := len(tmpEntries(t, root)); n != 0 {
				t.Errorf("%d entries left in tmp", n)
			}
			if used := diskUsage(t, root); used > 1<<20 {
				t.Errorf("the cache takes %d bytes on disk after the refusal, want under 1 MiB", used)
			}
		})
	}
}
