package controlplane

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

//go:embed openapi.json
var openAPI []byte

// maxBody bounds every request body the server decodes as JSON, except a
// POST /v1/runs/batch's (maxBatchBody, runs.go).
const maxBody = 1 << 20

// maxLogBody bounds one log chunk from an agent.
const maxLogBody = 8 << 20

type route struct {
	pattern string
	handler func(http.ResponseWriter, *http.Request)
}

// publicRoutes is the public API, every route behind an API credential.
// openapi.json documents exactly these (a test checks it).
func (s *Server) publicRoutes() []route {
	return append([]route{
		{"POST /v1/runs", s.submitRun},
		{"POST /v1/runs/batch", s.submitRuns},
		{"GET /v1/runs", s.listRuns},
		{"GET /v1/runs/{id}", s.getRun},
		{"POST /v1/runs/{id}/cancel", s.cancelRun},
		{"GET /v1/runs/{id}/wait", s.waitRun},
		{"GET /v1/runs/{id}/logs", s.runLogs},
		{"GET /v1/nodes", s.listNodes},
		{"GET /v1/nodes/{id}", s.getNode},
		{"POST /v1/nodes/{id}/invitations", s.inviteNode},
		{"POST /v1/nodes/{id}/cordon", s.cordonNode},
		{"POST /v1/nodes/{id}/uncordon", s.uncordonNode},
		{"POST /v1/nodes/{id}/drain", s.drainNode},
		{"POST /v1/artifacts/{name}/uploads", s.createUpload},
		{"GET /v1/uploads/{id}", s.getUpload},
		{"PUT /v1/uploads/{id}", s.putUpload},
		{"POST /v1/uploads/{id}/commit", s.commitUpload},
		{"GET /v1/artifacts", s.listArtifacts},
		{"GET /v1/artifacts/{name}", s.listArtifactVersions},
		{"GET /v1/artifacts/{name}/versions/{version}", s.getArtifactVersion},
		{"POST /v1/registries", s.putRegistry},
		{"GET /v1/registries", s.listRegistries},
		{"DELETE /v1/registries/{host}", s.deleteRegistry},
	}, s.functionRoutes()...) // functions.go
}

// Handler returns the HTTP handler for the public API and the node protocol.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	// Public API.
	mux.Handle("GET /metrics", s.metrics.handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openAPI)
	})
	for _, rt := range s.publicRoutes() {
		mux.Handle(rt.pattern, s.admin(rt.handler))
	}
	// Node protocol.
	mux.HandleFunc("POST "+capability.PathEnroll, s.enroll)
	mux.Handle("POST "+capability.PathRenew, s.nodeAuth(s.renew))
	mux.Handle("POST "+capability.PathSession, s.nodeAuth(s.session))
	mux.Handle("POST "+capability.PathEvents, s.nodeAuth(s.events))
	mux.Handle("POST "+capability.PathLogs, s.nodeAuth(s.nodeLogs))
	s.functionNodeRoutes(mux) // invoke.go: the calls paths
	// functions_logs.go: agents' answers to call_log commands.
	mux.Handle("POST "+capability.PathCallLogs+"{id}", s.nodeAuth(s.callLogAnswer))
	// Signed content reads (artifacts.go): the signature is the credential.
	mux.HandleFunc("GET "+content.ReadPath+"{digest}", s.serveContent)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &failure.Error{Kind: failure.ErrNotFound, Message: fmt.Sprintf("no route %s %s; see /v1/openapi.json", r.Method, r.URL.Path)})
	})
	return recoverer(s, s.metrics.instrument(mux))
}

// recoverer turns a panic in a handler into a 500 with the API's error shape
// instead of a dropped connection, and logs it. A malformed request must
// never take the process down.
func recoverer(s *Server, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", v)
				writeError(w, fmt.Errorf("internal error"))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// admin requires an API credential.
func (s *Server) admin(h func(http.ResponseWriter, *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := bearer(r)
		if !ok {
			writeAuthError(w, r, failure.Unauthorized("this API needs a credential: send `Authorization: Bearer <token>` (the CLI reads MERCATOR_TOKEN or --token-file)"))
			return
		}
		err := s.checkToken(r.Context(), tok) // invoke.go: cached briefly
		if errors.Is(err, failure.ErrNotFound) {
			writeAuthError(w, r, failure.Unauthorized("the credential is not valid for this control plane"))
			return
		}
		if err != nil {
			writeAuthError(w, r, err)
			return
		}
		h(w, r)
	})
}

type nodeCaller struct {
	nodeID  string
	session store.Session
}

type nodeCallerKey struct{}

// nodeAuth requires a valid, current session credential and refuses one
// fenced below the node's token with failure.ErrFenced.
func (s *Server) nodeAuth(h func(http.ResponseWriter, *http.Request, nodeCaller)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := s.authenticateNode(r.Context(), r)
		if err != nil {
			s.metrics.refused.WithLabelValues(failure.Code(err)).Inc()
			writeError(w, err)
			return
		}
		h(w, r, c)
	})
}

func (s *Server) authenticateNode(ctx context.Context, r *http.Request) (nodeCaller, error) {
	tok, ok := bearer(r)
	nodeID := r.Header.Get(capability.HeaderNodeID)
	if !ok || nodeID == "" {
		return nodeCaller{}, failure.Unauthorized("node calls need `Authorization: Bearer <session token>` and %s", capability.HeaderNodeID)
	}
	// The session and the node's fencing token come from authCache when
	// it has them (see authcache.go).
	sess, fence, err := s.nodeSession(ctx, hashToken(tok), nodeID)
	if errors.Is(err, failure.ErrNotFound) || (err == nil && sess.NodeID != nodeID) {
		return nodeCaller{}, failure.Unauthorized("session credential not recognised for node %q; enroll again with a new invitation", nodeID)
	}
	if err != nil {
		return nodeCaller{}, err
	}
	if !sess.ExpiresAt.After(s.now()) {
		return nodeCaller{}, failure.Unauthorized("session credential for node %q expired at %s; the agent was offline past its credential's life: run `mercator node invite %s` and restart the agent with the new token", nodeID, sess.ExpiresAt.Format("2006-01-02T15:04:05Z07:00"), nodeID)
	}
	if sess.FencingToken < fence {
		return nodeCaller{}, fencedError(nodeID, fence, sess.FencingToken)
	}
	return nodeCaller{nodeID: nodeID, session: sess}, nil
}

func fencedError(nodeID string, fence, held uint64) error {
	return failure.Fenced("node %q was enrolled again (fencing token %d); this session holds token %d and may no longer act for it", nodeID, fence, held)
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	tok = strings.TrimSpace(tok)
	return tok, ok && tok != ""
}

// decode reads exactly one JSON object into v, refusing unknown fields,
// trailing data and oversized bodies with an invalid-kind error.
func decode(r *http.Request, limit int64, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return failure.Invalid("", "reading request body: %v", err)
	}
	if int64(len(body)) > limit {
		return failure.Invalid("", "request body is larger than %d bytes", limit)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return failure.Invalid("", "request body is empty; send a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		var syntaxErr *json.SyntaxError
		switch {
		case errors.As(err, &typeErr):
			return failure.Invalid(typeErr.Field, "must be of JSON type %s, not %s", typeErr.Type, typeErr.Value)
		case errors.As(err, &syntaxErr):
			return failure.Invalid("", "malformed JSON at byte %d: %v", syntaxErr.Offset, err)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return failure.Invalid(field, "unknown field; see /v1/openapi.json for the accepted fields")
		}
		return failure.Invalid("", "malformed JSON: %v", err)
	}
	if dec.More() {
		return failure.Invalid("", "trailing data after the JSON object")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, api.StatusOf(err), api.ErrorOf(err))
}
