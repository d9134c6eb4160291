package directio

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"unsafe"
)

func aligned(n int) []byte {
	b := make([]byte, n+Align)
	off := (Align - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%Align)) % Align
	return b[off : off+n]
}

// TestWritesWhatItIsGiven: aligned pieces, an unaligned tail, and an append
// after it, land as written, whether or not the filesystem takes direct
// writes.
func TestWritesWhatItIsGiven(t *testing.T) {
	for _, dir := range []string{t.TempDir(), "/dev/shm"} {
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		p := filepath.Join(dir, "directio-test-"+filepath.Base(t.TempDir()))
		defer os.Remove(p)
		w, err := Create(p, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		var want []byte
		piece := aligned(1 << 20)
		for i := range 3 {
			for j := range piece {
				piece[j] = byte(i*31 + j)
			}
			if _, err := w.Write(piece); err != nil {
				t.Fatal(err)
			}
			want = append(want, piece...)
		}
		tail := []byte("an unaligned tail")
		if _, err := w.Write(tail); err != nil {
			t.Fatal(err)
		}
		want = append(want, tail...)
		if err := w.Sync(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		a, err := Append(p)
		if err != nil {
			t.Fatal(err)
		}
		if a.Direct() {
			t.Errorf("%s: an append at an unaligned size is direct", dir)
		}
		a.Write([]byte("more"))
		a.Close()
		want = append(want, "more"...)
		got, _ := os.ReadFile(p)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: file holds %d bytes, want %d (equal %v)", dir, len(got), len(want), bytes.Equal(got, want))
		}
	}
}
