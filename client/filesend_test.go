package client

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/hashcopy"
)

// readsTo is a payload over data whose reads record how far into the
// content they have gone.
func readsTo(data []byte, reached *atomic.Int64) Payload {
	p := BytesPayload(data, "", "")
	open := p.Open
	p.Open = func(offset int64) (io.ReadCloser, error) {
		rc, err := open(offset)
		if err != nil {
			return nil, err
		}
		return &reachReader{ReadCloser: rc, at: offset, reached: reached}, nil
	}
	return p
}

type reachReader struct {
	io.ReadCloser
	at      int64
	reached *atomic.Int64
}

func (r *reachReader) Read(b []byte) (int, error) {
	n, err := r.ReadCloser.Read(b)
	r.at += int64(n)
	r.reached.Store(r.at)
	return n, err
}

// TestCheckFileStaysWithinItsLead: the check's read of a file goes no
// further than its lead beyond where the send stands (the file's
// position), follows the send as it moves, runs to the end once the send
// has read the whole file or is over, and computes the content's CRC-32C; content that ends early is
// the content's error.
func TestCheckFileStaysWithinItsLead(t *testing.T) {
	piece := int64(hashcopy.CacheRead) // what the check reads at once
	data := make([]byte, 4*piece+100)
	rand.Read(data)
	sent, err := os.Create(filepath.Join(t.TempDir(), "sent"))
	if err != nil {
		t.Fatal(err)
	}
	defer sent.Close()
	cur := &fileCursor{f: sent, end: int64(len(data))}
	var reached atomic.Int64
	d := newSendCheck()
	done := make(chan error, 1)
	go func() { done <- checkFile(context.Background(), d, readsTo(data, &reached), 0, cur, piece/2) }()

	held := func(limit int64) {
		t.Helper()
		time.Sleep(50 * time.Millisecond) // would the check go on without the send?
		if got := reached.Load(); got > limit {
			t.Fatalf("the check read to %d with the send at %d, beyond its lead (%d)", got, limit-piece/2, piece/2)
		}
	}
	held(0)                          // the first piece needs the send at piece/2
	sent.Seek(piece/2, io.SeekStart) // the send moves: one piece may be read
	waitUntil(t, func() bool { return reached.Load() == piece })
	held(piece)
	sent.Seek(2*piece+piece/2, io.SeekStart)
	waitUntil(t, func() bool { return reached.Load() == 3*piece })
	held(3 * piece)
	sent.Seek(int64(len(data)), io.SeekStart) // the send has read it all: so may the check
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d.n != int64(len(data)) || d.sum() != crcOf(data) {
		t.Errorf("check covers %d bytes with %s, want %d with %s", d.n, d.sum(), len(data), crcOf(data))
	}

	// Content that ends before its size is the content's error.
	short := readsTo(data, &reached)
	short.Size = int64(len(data)) + 5
	over := &fileCursor{f: sent, end: short.Size}
	over.finish()
	err = checkFile(context.Background(), newSendCheck(), short, 0, over, piece)
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "ended after") {
		t.Errorf("short content: %v, want the content's error", err)
	}
	// A check held back stops with its context.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sent.Seek(0, io.SeekStart)
	if err := checkFile(ctx, newSendCheck(), readsTo(data, &reached), 0, &fileCursor{f: sent, end: int64(len(data))}, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

func crcOf(b []byte) string {
	d := newSendCheck()
	d.Write(b)
	return d.sum()
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; i < 1000 && !cond(); i++ {
		time.Sleep(5 * time.Millisecond)
	}
	if !cond() {
		t.Fatal("condition not reached")
	}
}
