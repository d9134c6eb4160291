package daemon

import (
	"bufio"
	"context"
	"crypto/x509"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/pki"
)

// TestAgentClientOneConnectionForStreamAndCalls checks what makes a
// fleet-wide reconnect cost one TLS handshake a node: the agent's client
// speaks HTTP/2 to a server that offers it, and its session stream and the
// calls made while the stream is open share one connection.
func TestAgentClientOneConnectionForStreamAndCalls(t *testing.T) {
	s, err := pki.OpenServer(pki.ServerOptions{DataDir: t.TempDir(), Hosts: []string{"127.0.0.1"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	var protos [2]atomic.Int64 // requests seen over HTTP/1.x, over HTTP/2
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		protos[r.ProtoMajor-1].Add(1)
		w.Write([]byte("open\n"))
		w.(http.Flusher).Flush()
		<-release
	})
	mux.HandleFunc("/call", func(w http.ResponseWriter, r *http.Request) {
		protos[r.ProtoMajor-1].Add(1)
		w.Write([]byte("ok"))
	})
	srv := &http.Server{Handler: mux, TLSConfig: s.TLSConfig(), ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { close(release); srv.Close() })

	hc := AgentHTTPClient([]*x509.Certificate{s.CA()}, nil)
	base := "https://" + l.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/stream", nil)
	stream, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if line, err := bufio.NewReader(stream.Body).ReadString('\n'); err != nil || line != "open\n" {
		t.Fatalf("stream: %q, %v", line, err)
	}
	for range 5 {
		resp, err := hc.Get(base + "/call")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("the stream and 5 calls took %d connections; want 1", got)
	}
	if h1, h2 := protos[0].Load(), protos[1].Load(); h1 != 0 || h2 != 6 {
		t.Errorf("requests over HTTP/1.x: %d, over HTTP/2: %d; want 0 and 6", h1, h2)
	}
}
