package hashcopy

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

func TestCopyHashesWhatItWrites(t *testing.T) {
	for _, size := range []int{0, 1, PieceSize - 1, PieceSize, 3*PieceSize + 17} {
		data := make([]byte, size)
		r := rand.New(rand.NewPCG(1, uint64(size)))
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		var dst bytes.Buffer
		h := sha256.New()
		n, err := Copy(&dst, iotest.HalfReader(bytes.NewReader(data)), h, int64(size))
		want := sha256.Sum256(data)
		if err != nil || n != int64(size) || !bytes.Equal(dst.Bytes(), data) || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Errorf("size %d: n %d, err %v, copy equal %v, hash equal %v", size, n, err, bytes.Equal(dst.Bytes(), data), bytes.Equal(h.Sum(nil), want[:]))
		}
	}
}

func TestCopyStopsPastTheLimit(t *testing.T) {
	var dst bytes.Buffer
	n, err := Copy(&dst, bytes.NewReader(make([]byte, 5*PieceSize)), sha256.New(), 10)
	if err != nil || n != 11 {
		t.Errorf("n = %d, err %v; want 11 (limit+1) and no error", n, err)
	}
}

type failAfter struct{ left int }

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.left {
		return 0, errors.New("no space left on device")
	}
	f.left -= len(p)
	return len(p), nil
}

func TestCopyReportsWriteAndReadErrors(t *testing.T) {
	_, err := Copy(&failAfter{left: PieceSize}, bytes.NewReader(make([]byte, 4*PieceSize)), sha256.New(), 4*PieceSize)
	var we *WriteError
	if !errors.As(err, &we) {
		t.Errorf("write failure = %v, want *WriteError", err)
	}
	cut := io.MultiReader(bytes.NewReader(make([]byte, PieceSize+5)), iotest.ErrReader(io.ErrClosedPipe))
	_, err = Copy(io.Discard, cut, sha256.New(), 4*PieceSize)
	if !errors.Is(err, io.ErrClosedPipe) || errors.As(err, &we) {
		t.Errorf("read failure = %v, want the reader's error", err)
	}
	// h is any writer (several hashes behind io.MultiWriter); its error
	// ends the copy and comes back as it is, not as a write error.
	var dst bytes.Buffer
	n, err := Copy(&dst, bytes.NewReader(make([]byte, 4*PieceSize)), &failAfter{left: PieceSize}, 4*PieceSize)
	if err == nil || errors.As(err, &we) || n > PieceSize || dst.Len() > PieceSize {
		t.Errorf("hash failure = %v after %d bytes written, want its error, and nothing written past what was hashed", err, n)
	}
}

// TestInCacheReadsAtMostCacheRead: reads through InCache return at most
// CacheRead bytes, and all of the content in order.
func TestInCacheReadsAtMostCacheRead(t *testing.T) {
	data := make([]byte, 3*CacheRead+5)
	for i := range data {
		data[i] = byte(i * 7)
	}
	r := InCache(bytes.NewReader(data))
	var got []byte
	buf := make([]byte, 2*CacheRead)
	for {
		n, err := r.Read(buf)
		if n > CacheRead {
			t.Fatalf("a read returned %d bytes, more than %d", n, CacheRead)
		}
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the content read through InCache differs")
	}
}
