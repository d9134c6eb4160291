package inprocess

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"testing"
)

// TestStreamsAndEnds: the status and headers arrive before the body is
// done, each write reaches the reader as written, and the handler's
// context ends with the request's.
func TestStreamsAndEnds(t *testing.T) {
	next, ended := make(chan struct{}), make(chan struct{})
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.RemoteAddr != "192.0.2.1:5" || r.Header.Get("X-Test") != "yes" {
			http.Error(w, "request not passed on", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "one\n")
		<-next
		io.WriteString(w, "two\n")
		<-r.Context().Done()
		close(ended)
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://in-process/x", nil)
	req.Header.Set("X-Test", "yes")
	hc := &http.Client{Transport: Transport{Handler: &h, RemoteAddr: "192.0.2.1:5"}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusAccepted || resp.Header.Get("Content-Type") != "text/plain" {
		t.Fatalf("answer %d %v", resp.StatusCode, resp.Header)
	}
	lines := bufio.NewReader(resp.Body)
	if l, _ := lines.ReadString('\n'); l != "one\n" {
		t.Fatalf("first line %q", l)
	}
	close(next) // the handler writes the second line only after the first was read
	if l, _ := lines.ReadString('\n'); l != "two\n" {
		t.Fatalf("second line %q", l)
	}
	cancel()
	<-ended
	resp.Body.Close()
}
