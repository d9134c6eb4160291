package controlplane

import (
	_ "embed"
	"fmt"
	"net/http"
	"slices"

	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/controlplane/function"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

//go:embed openapi.json
var openAPI []byte

// maxLogBody bounds one log chunk from an agent.
const maxLogBody = 8 << 20

// publicRoutes is the public API, every route behind an API credential:
// Mercator's own (v1Routes) and the Fn-compatible ones (package function).
// openapi.json documents exactly these (a test checks it).
func (s *Server) publicRoutes() []httpapi.Route {
	return append(s.v1Routes(), s.fn.Routes()...)
}

// v1Routes is Mercator's own API, whose errors take api.Error's shape.
func (s *Server) v1Routes() []httpapi.Route {
	return append([]httpapi.Route{
		{Pattern: "POST /v1/runs", Handler: s.submitRun},
		{Pattern: "POST /v1/runs/batch", Handler: s.submitRuns},
		{Pattern: "GET /v1/runs", Handler: s.listRuns},
		{Pattern: "GET /v1/runs/{id}", Handler: s.getRun},
		{Pattern: "POST /v1/runs/{id}/cancel", Handler: s.cancelRun},
		{Pattern: "GET /v1/runs/{id}/wait", Handler: s.waitRun},
		{Pattern: "GET /v1/runs/{id}/logs", Handler: s.runLogs},
		{Pattern: "GET /v1/nodes", Handler: s.listNodes},
		{Pattern: "GET /v1/nodes/{id}", Handler: s.getNode},
		{Pattern: "POST /v1/nodes/{id}/invitations", Handler: s.inviteNode},
		{Pattern: "POST /v1/nodes/{id}/cordon", Handler: s.cordonNode},
		{Pattern: "POST /v1/nodes/{id}/uncordon", Handler: s.uncordonNode},
		{Pattern: "POST /v1/nodes/{id}/drain", Handler: s.drainNode},
	}, slices.Concat(s.artifacts.Routes(), s.registries.Routes())...)
}

// writeAuthError writes a refusal of an API credential on a v1 route.
func writeAuthError(w http.ResponseWriter, _ *http.Request, err error) { httpapi.WriteError(w, err) }

// Handler returns the HTTP handler for the public API and the node protocol.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	// Public API.
	mux.Handle("GET /metrics", s.metrics.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openAPI)
	})
	for _, rt := range s.v1Routes() {
		mux.Handle(rt.Pattern, s.admin.Require(rt.Handler, writeAuthError))
	}
	for _, rt := range s.fn.Routes() {
		mux.Handle(rt.Pattern, s.admin.Require(rt.Handler, function.WriteAuthError))
	}
	// Node protocol.
	mux.HandleFunc("POST "+nodeproto.PathEnroll, s.enroll)
	mux.Handle("POST "+nodeproto.PathRenew, s.nodeAuth(s.renew))
	mux.Handle("POST "+nodeproto.PathSession, s.nodeAuth(s.session))
	mux.Handle("POST "+nodeproto.PathEvents, s.nodeAuth(s.events))
	mux.Handle("POST "+nodeproto.PathLogs, s.nodeAuth(s.nodeLogs))
	for _, rt := range s.fn.NodeRoutes() { // the calls paths, call_log answers
		mux.Handle(rt.Pattern, s.nodeAuth(rt.Handler))
	}
	// Signed content reads (package artifact): the signature is the credential.
	mux.HandleFunc("GET "+content.ReadPath+"{digest}", s.artifacts.ServeContent)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, &failure.Error{Kind: failure.ErrNotFound, Message: fmt.Sprintf("no route %s %s; see /v1/openapi.json", r.Method, r.URL.Path)})
	})
	return httpapi.Recoverer(s.log, s.metrics.Instrument(mux))
}
