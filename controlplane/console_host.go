package controlplane

import (
	"io"
	"net/http"
	"sync"

	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane/console"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
)

// newConsole returns the web console (package console) over the public API
// served by *root, which the caller sets once the handler is built: every
// page calls the API in process as the signed-in credential, through the
// same credential check, roles, limits and audit log as a remote caller.
func (s *Server) newConsole(root *http.Handler) *console.Console {
	return console.New(console.Config{
		Auth: s.tokens,
		Now:  s.cfg.Now,
		Log:  s.log,
		APIFor: func(tok string, r *http.Request) console.API {
			return client.New("http://console.in-process", tok, &http.Client{Transport: inProcess{h: root, remote: r.RemoteAddr}})
		},
	})
}

// consoleRoutes serves the console's routes on mux (through serve, the
// limiter), each with the role consoleAccess declares.
func consoleRoutes(c *console.Console, serve func(pattern string, h http.Handler)) {
	for _, rt := range c.Routes() {
		role, ok := consoleAccess[rt.Pattern]
		if !ok {
			panic("controlplane: console route " + rt.Pattern + " has no entry in consoleAccess (routes.go)")
		}
		rt.Role = role
		serve(rt.Pattern, c.Handle(rt))
	}
}

// inProcess is an http.RoundTripper that serves each request with *h in
// this process, streaming the answer through a pipe (a followed log goes
// on for as long as the run). remote is the browser's address, which the
// audit log records for the console's changes.
type inProcess struct {
	h      *http.Handler
	remote string
}

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	in := req.Clone(req.Context())
	in.RemoteAddr, in.RequestURI = t.remote, req.URL.RequestURI()
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
		(*t.h).ServeHTTP(w, in)
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

// pipeResponse is the handler's side of an inProcess exchange: the status
// and headers as of the first write, then the body into the pipe.
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

// consoleAuthenticator keeps the console's credential check the API's own.
var _ console.Authenticator = (*httpapi.Tokens)(nil)
