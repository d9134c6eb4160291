package client

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/mercator/mercator/failure"
)

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// crcSum is b's CRC-32C as a commit states it, computed without the api
// package's helpers.
func crcSum(b []byte) string {
	return fmt.Sprintf("%08x", crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// TestRunningDigestRewinds: a digest fed ahead of what the control plane
// holds goes back to any offset, from a saved state or from the start, and
// rereads only from there; so does the CRC-32C a push states at its
// commit.
func TestRunningDigestRewinds(t *testing.T) {
	t.Run("crc32c", func(t *testing.T) { testRunningDigestRewinds(t, newSendCheck, crcSum) })
	t.Run("sha256", func(t *testing.T) { testRunningDigestRewinds(t, newContentDigest, hexSum) })
}

func testRunningDigestRewinds(t *testing.T, newDigest func() *runningDigest, sumOf func([]byte) string) {
	data := make([]byte, 10_000)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.IntN(256))
	}
	var opened []int64
	open := func(offset int64) (io.ReadCloser, error) {
		opened = append(opened, offset)
		return io.NopCloser(bytes.NewReader(data[offset:])), nil
	}
	d := newDigest()
	d.every = 1000
	// Fed in pieces, as hashcopy does, past several marks.
	for off := 0; off < 7_300; off += 730 {
		d.Write(data[off : off+730])
	}
	if len(d.marks) == 0 || d.n != 7_300 {
		t.Fatalf("n = %d, marks %d", d.n, len(d.marks))
	}
	for _, to := range []int64{7_300, 5_500, 5_500, 2_000, 9_999, 10_000, 0, 10_000} {
		opened = nil
		before := d.n
		if err := d.rewind(to, open); err != nil {
			t.Fatal(err)
		}
		if d.n != to || d.sum() != sumOf(data[:to]) {
			t.Fatalf("rewind(%d) from %d: n = %d, digest wrong", to, before, d.n)
		}
		// Going back rereads from a mark, not from the start, when one
		// is at or before the target.
		if to < before && to >= 1_000 && len(opened) == 1 && opened[0] == 0 {
			t.Errorf("rewind(%d) from %d reread from byte 0", to, before)
		}
	}
	// More marks than kept: the oldest are dropped, and going back past
	// them rereads from the start, still right.
	d.Reset()
	d.every, d.keep = 100, 8
	for off := 0; off < len(data); off += 50 {
		d.Write(data[off : off+50])
	}
	if len(d.marks) != d.keep {
		t.Fatalf("%d marks kept, want %d", len(d.marks), d.keep)
	}
	if err := d.rewind(150, open); err != nil || d.sum() != sumOf(data[:150]) {
		t.Fatalf("rewind past the kept marks: %v", err)
	}
	// A payload that ends early leaves the digest usable.
	short := func(offset int64) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data[offset:5_000])), nil
	}
	if err := d.rewind(8_000, short); err == nil {
		t.Fatal("rewinding past the content's end succeeded")
	}
	if err := d.rewind(3_000, open); err != nil || d.sum() != sumOf(data[:3_000]) {
		t.Fatalf("after a failed rewind: %v", err)
	}
}

// TestSizedReaderRefusesOtherSizes: content shorter or longer than its
// declared size is an invalid error, not an end.
func TestSizedReaderRefusesOtherSizes(t *testing.T) {
	data := []byte("0123456789")
	read := func(content []byte, at, size int64) ([]byte, error) {
		return io.ReadAll(&sizedReader{r: bytes.NewReader(content), at: at, left: size - at, size: size})
	}
	if got, err := read(data[4:], 4, 10); err != nil || string(got) != "456789" {
		t.Errorf("exact: %q, %v", got, err)
	}
	if _, err := read(data[4:], 4, 12); !errors.Is(err, failure.ErrInvalid) {
		t.Errorf("shorter than declared: %v", err)
	}
	if _, err := read(data[4:], 4, 8); !errors.Is(err, failure.ErrInvalid) {
		t.Errorf("longer than declared: %v", err)
	}
}

// TestContentBodyReadPath: a transport that reads the body (HTTP/2's)
// gets the same bytes, checked, as one that has it write itself; the
// content's own error is told apart from the connection's; a body closed
// unsent reports nothing.
func TestContentBodyReadPath(t *testing.T) {
	data := bytes.Repeat([]byte("piece"), 700_000) // several pieces
	newBody := func(content []byte, size int64) (*contentBody, *runningDigest) {
		d := newSendCheck()
		return &contentBody{src: &sizedReader{r: bytes.NewReader(content), left: size, size: size}, d: d, left: size, done: make(chan struct{})}, d
	}
	b, d := newBody(data, int64(len(data)))
	got, err := io.ReadAll(b)
	b.Close()
	if err != nil || !bytes.Equal(got, data) || b.wait() != nil || d.sum() != crcSum(data) {
		t.Fatalf("read %d bytes, %v; wait %v", len(got), err, b.wait())
	}
	if _, err := b.WriteTo(io.Discard); !errors.Is(err, errBodyUsed) {
		t.Errorf("sent twice: %v", err)
	}

	b, _ = newBody(data[:1000], 2000)
	if _, err := io.ReadAll(b); !errors.Is(err, failure.ErrInvalid) || !errors.Is(b.wait(), failure.ErrInvalid) {
		t.Errorf("short content: read %v, wait %v", err, b.wait())
	}

	b, _ = newBody(data, int64(len(data)))
	b.Read(make([]byte, 10))
	b.Close() // the transport gave up midway
	if err := b.wait(); err != nil {
		t.Errorf("a body closed midway reports %v; the connection's failure is the request's to report", err)
	}

	b, _ = newBody(data, int64(len(data)))
	b.Close()
	if err := b.wait(); err != nil {
		t.Errorf("a body closed unsent reports %v", err)
	}
	var out bytes.Buffer
	b, d = newBody(data, int64(len(data)))
	if n, err := b.WriteTo(&out); err != nil || n != int64(len(data)) || !bytes.Equal(out.Bytes(), data) || d.sum() != crcSum(data) {
		t.Errorf("WriteTo: %d, %v", n, err)
	}
}
