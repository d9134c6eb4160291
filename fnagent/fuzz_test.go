package fnagent

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzRelay feeds arbitrary bytes to relay as a container's HTTP answer
// (the function container protocol's frame: a status line, headers and a
// body on the container's socket). Whatever a container sends, relay must
// not panic, must not write more than the function's response limit to
// the caller, must keep the container only after a 200 or 502 read to its
// end, and must answer the caller with a status Go's server accepts.
func FuzzRelay(f *testing.F) {
	for _, seed := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nFn-Http-Status: 201\r\nFn-Http-H-X-Custom: a\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 4\r\n\r\noops",
		"HTTP/1.1 504 Gateway Timeout\r\n\r\n",
		"HTTP/1.1 200 OK\r\nFn-Http-Status: 99\r\n\r\n",
		"HTTP/1.1 200 OK\r\nFn-Http-Status: 1000\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
		"HTTP/1.1 200 OK\r\nFn-Http-H-Content-Length: 3\r\nFn-Http-H-: x\r\nConnection: close\r\n\r\nbody",
		"HTTP/1.1 418 I'm a teapot\r\n\r\n",
		"garbage",
	} {
		f.Add([]byte(seed))
	}
	const limit = 64
	f.Fuzz(func(t *testing.T, frame []byte) {
		req := httptest.NewRequest(http.MethodPost, "http://container/call", nil)
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(frame)), req)
		if err != nil {
			return // the transport refuses it before relay sees it
		}
		defer resp.Body.Close()
		w := httptest.NewRecorder()
		var report CallReport
		keep, reason, cerr, lost := relay(w, resp, limit, &report)
		if w.Body.Len() > limit {
			t.Fatalf("relay wrote %d bytes to the caller; the limit is %d", w.Body.Len(), limit)
		}
		if report.ResponseBytes != int64(w.Body.Len()) {
			t.Fatalf("reported %d response bytes, wrote %d", report.ResponseBytes, w.Body.Len())
		}
		if keep && resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("container kept after status %d", resp.StatusCode)
		}
		if keep && cerr == nil && lost == nil {
			if _, err := resp.Body.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Fatalf("container kept with its body unread (%v)", err)
			}
		}
		if !keep && reason == "" {
			t.Fatal("container dropped without a reason")
		}
		if cerr != nil && lost != nil {
			t.Fatal("both a call error and a lost connection")
		}
		if cerr == nil && lost == nil && (w.Code < 100 || w.Code > 999) {
			t.Fatalf("caller answered status %d", w.Code)
		}
	})
}
