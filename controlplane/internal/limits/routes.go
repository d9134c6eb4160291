package limits

import (
	"net"
	"net/http"

	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/nodeproto"
)

// The classes of routes that are not ordinary API calls (API).
var (
	// Stream: a long answer (a wait, a log follow, a download) with no body
	// to speak of.
	Stream = Class{Name: "stream", Body: httpapi.MaxBody, Stream: true}
	// Invocation: Fn's sync invocations and triggers stream the body in
	// while the answer streams out (full duplex); the handler refuses a
	// body over api.FnMaxRequestBytes in Fn's error shape.
	Invocation = Class{Name: "invocation", Body: Unbounded, Stream: true, Upload: true}
	// Upload: an Artifact upload's bytes, or a function's answer relayed by
	// its node; the handler holds the body to its declared size.
	Upload = Class{Name: "upload", Body: Unbounded, Upload: true}
	// Session: a node's session stream, a few at once while a reconnect
	// overlaps the stream the server has not noticed is dead.
	Session = Class{Name: "session stream", Body: httpapi.MaxBody, Stream: true, PerCaller: SessionsPerNode}
	// CallAnswers: a node's call answers stream (nodeproto.PathCallAnswers),
	// a long request body of whole function answers, or the connection
	// itself once upgraded, which its handler reads under an idle deadline
	// of its own (package callstream); counted with the node's session
	// streams for as long as the handler holds it.
	CallAnswers = Class{Name: "call answers stream", Body: Unbounded, Stream: true, PerCaller: SessionsPerNode}
	// NodeEvents and NodeLogs: a node's posts, limited per node and by the
	// node body budget.
	NodeEvents = Class{Name: "node events", Body: nodeproto.MaxEventBody, NodeBulk: true}
	NodeLogs   = Class{Name: "node logs", Body: nodeproto.MaxLogBody, NodeBulk: true}
	// Handled: a handler that reads its body under a limit of its own
	// (the run batch's 64 MiB, an async invocation's api.FnMaxRequestBytes
	// refused in Fn's shape, a call's error and log texts).
	Handled = Class{Name: "api", Body: Unbounded}
)

// classes is the class of every route, public or node, that is not API,
// by its ServeMux pattern. It sits here rather than beside the roles in
// package controlplane's routes.go only to keep that package within its
// size; controlplane's TestEveryLimitClassNamesARoute checks that every
// pattern is served.
var classes = map[string]Class{
	"POST /v1/runs/batch":                           Handled,
	"GET /v1/runs/{id}/wait":                        Stream,
	"GET /v1/runs/{id}/logs":                        Stream,
	"GET /ui/runs/{id}/log":                         Stream, // the console's live log (server-sent events)
	"PUT /v1/uploads/{id}":                          Upload,
	"POST /v1/agent-releases":                       Upload,
	"POST /invoke/{fn_id}":                          Invocation,
	"POST /invoke/{fn_id}/async":                    Handled,
	"GET /t/{app_name}/{source...}":                 Invocation,
	"POST /t/{app_name}/{source...}":                Invocation,
	"PUT /t/{app_name}/{source...}":                 Invocation,
	"PATCH /t/{app_name}/{source...}":               Invocation,
	"DELETE /t/{app_name}/{source...}":              Invocation,
	"OPTIONS /t/{app_name}/{source...}":             Invocation,
	"GET " + content.ReadPath + "{digest}":          Stream,
	"POST " + nodeproto.PathSession:                 Session,
	"POST " + nodeproto.PathEvents:                  NodeEvents,
	"POST " + nodeproto.PathLogs:                    NodeLogs,
	"GET " + nodeproto.PathCalls + "{id}/request":   Stream,
	"POST " + nodeproto.PathCalls + "{id}/response": Upload,
	"POST " + nodeproto.PathCalls + "{id}/log":      Handled,
	"POST " + nodeproto.PathCallLogs + "{id}":       Handled,
	"POST " + nodeproto.PathCallAnswers:             CallAnswers,
}

// Of is the class of the route with ServeMux pattern p: API unless the
// table above says otherwise.
func Of(p string) Class {
	if c, ok := classes[p]; ok {
		return c
	}
	return API
}

// Classified lists the patterns that have a class other than API.
func Classified() []string {
	out := make([]string, 0, len(classes))
	for p := range classes {
		out = append(out, p)
	}
	return out
}

// Route limits h, served at pattern, by its class (Of), counting each
// request against its caller (CallerKey).
func (l *Limiter) Route(pattern string, h http.Handler) http.Handler {
	return l.Wrap(Of(pattern), CallerKey, h)
}

// Handle returns a function that serves a route on mux, limited (Route).
func (l *Limiter) Handle(mux *http.ServeMux) func(pattern string, h http.Handler) {
	return func(pattern string, h http.Handler) { mux.Handle(pattern, l.Route(pattern, h)) }
}

// HandleNode returns a function that serves a node-protocol route on mux,
// behind auth (which proves the node) and limited (NodeRoute).
func (l *Limiter) HandleNode(mux *http.ServeMux, auth func(func(http.ResponseWriter, *http.Request, httpapi.NodeCaller)) http.Handler) func(pattern string, h httpapi.NodeHandler) {
	return func(pattern string, h httpapi.NodeHandler) { mux.Handle(pattern, auth(l.NodeRoute(pattern, h))) }
}

// NodeRoute limits a node-protocol handler served at pattern by its class,
// counting each request against the node its session credential proved.
func (l *Limiter) NodeRoute(pattern string, h httpapi.NodeHandler) httpapi.NodeHandler {
	c := Of(pattern)
	return func(w http.ResponseWriter, r *http.Request, nc httpapi.NodeCaller) {
		key := func(*http.Request) string { return "node:" + nc.NodeID }
		l.Wrap(c, key, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h(w, r, nc) })).ServeHTTP(w, r)
	}
}

// CallerKey is who a public request counts against: the credential's name
// (httpapi.Tokens.Require, which must come first), else the remote address.
// Behind a proxy every caller without a credential shares the proxy's.
func CallerKey(r *http.Request) string {
	if c, ok := httpapi.CallerOf(r.Context()); ok && c.Name != "" {
		return "token:" + c.Name
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "addr:" + host
}
