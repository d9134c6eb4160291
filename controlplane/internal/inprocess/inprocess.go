// Package inprocess serves HTTP requests with a handler in the same
// process: an http.RoundTripper for a client of the process's own API (the
// web console calls the public API so, as the signed-in credential). Only
// package controlplane and its subpackages may import it.
package inprocess

import (
	"io"
	"net/http"
	"sync"
)

// Transport serves each request with *Handler in this process, streaming
// the answer through a pipe (a followed log goes on for as long as the
// run). *Handler is read at each request, so it may be set after the
// Transport is made (the handler that serves the console is the one the
// console calls). RemoteAddr is the request's, for the audit log and the
// limits. The zero value is not usable: set Handler.
type Transport struct {
	Handler    *http.Handler
	RemoteAddr string
}

// RoundTrip serves req. It answers once the handler has written its
// status (or returned); the body is read as the handler writes it, and
// the handler's context ends with req's.
func (t Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	in := req.Clone(req.Context())
	in.RemoteAddr, in.RequestURI = t.RemoteAddr, req.URL.RequestURI()
	if in.Body == nil {
		in.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeResponse{header: http.Header{}, body: pw, ready: make(chan struct{})}
	go func() {
		defer func() {
			w.WriteHeader(http.StatusOK) // a handler that wrote nothing
			pw.Close()
		}()
		(*t.Handler).ServeHTTP(w, in)
	}()
	select {
	case <-w.ready:
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	return &http.Response{Status: http.StatusText(w.status), StatusCode: w.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: pr, ContentLength: -1, Request: req}, nil
}

// pipeResponse is the handler's side of an exchange: the status and
// headers as of the first write, then the body into the pipe.
type pipeResponse struct {
	header http.Header
	body   *io.PipeWriter
	once   sync.Once
	ready  chan struct{}
	status int
	sent   http.Header
}

func (w *pipeResponse) Header() http.Header { return w.header }

func (w *pipeResponse) WriteHeader(status int) {
	w.once.Do(func() {
		w.status, w.sent = status, w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeResponse) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}

// Flush is a no-op: the pipe hands every write to the reader as it is made.
func (w *pipeResponse) Flush() {}

var _ http.Flusher = (*pipeResponse)(nil)
