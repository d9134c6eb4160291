package controlplane

import (
	_ "embed"
	"fmt"
	"net/http"
	"slices"

	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/controlplane/function"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

//go:embed openapi.json
var openAPI []byte

// The roles, as the access table spells them.
var (
	reader    = httpapi.Access{Role: httpapi.RoleReader}
	submitter = httpapi.Access{Role: httpapi.RoleSubmitter}
	operator  = httpapi.Access{Role: httpapi.RoleOperator}
	admin     = httpapi.Access{Role: httpapi.RoleAdmin}
	// invoke: submitter, or an invoker key of the app the call addresses
	// (package function confines it, httpapi.ConfineToApp), or a caller
	// without a credential when the app is public
	// (function.PublicInvokeAnnotation).
	invoke = httpapi.Access{Role: httpapi.RoleSubmitter, Invoker: true, Public: true}
	// trigger: invoke, and public also when the trigger itself is.
	trigger = httpapi.Access{Role: httpapi.RoleSubmitter, Invoker: true, Public: true}
)

// routeAccess is who may call every public route, declared once, here: a route
// missing from it is not served (publicRoutes panics), and openapi.json
// states each as x-mercator-role (with x-mercator-invoker and
// x-mercator-public), which TestOpenAPIDocumentsEveryRouteAndField checks
// and the role-matrix test drives.
var routeAccess = map[string]httpapi.Access{
	"POST /v1/runs":                               submitter,
	"POST /v1/runs/batch":                         submitter,
	"GET /v1/runs":                                reader,
	"GET /v1/runs/{id}":                           reader,
	"POST /v1/runs/{id}/cancel":                   submitter,
	"GET /v1/runs/{id}/wait":                      reader,
	"GET /v1/runs/{id}/logs":                      reader,
	"GET /v1/nodes":                               reader,
	"GET /v1/nodes/{id}":                          reader,
	"DELETE /v1/nodes/{id}":                       operator,
	"POST /v1/nodes/{id}/invitations":             operator,
	"GET /v1/nodes/{id}/invitations":              operator,
	"POST /v1/nodes/{id}/cordon":                  operator,
	"POST /v1/nodes/{id}/labels":                  operator,
	"POST /v1/nodes/{id}/uncordon":                operator,
	"POST /v1/nodes/{id}/drain":                   operator,
	"POST /v1/nodes/{id}/gpus/{uuid}/clear":       operator,
	"POST /v1/nodes/{id}/gpus/{uuid}/cordon":      operator,
	"POST /v1/nodes/{id}/gpus/{uuid}/uncordon":    operator,
	"POST /v1/tokens":                             admin,
	"GET /v1/tokens":                              admin,
	"DELETE /v1/tokens/{name}":                    admin,
	"GET /v1/audit":                               admin,
	"POST /v1/artifacts/{name}/uploads":           submitter,
	"GET /v1/uploads/{id}":                        reader,
	"PUT /v1/uploads/{id}":                        submitter,
	"POST /v1/uploads/{id}/commit":                submitter,
	"GET /v1/artifacts":                           reader,
	"GET /v1/artifacts/{name}":                    reader,
	"GET /v1/artifacts/{name}/versions/{version}": reader,
	"POST /v1/registries":                         operator,
	"GET /v1/registries":                          reader,
	"DELETE /v1/registries/{host}":                operator,
	"POST /v1/projects":                           operator,
	"GET /v1/projects":                            reader,
	"GET /v1/projects/{name}":                     reader,
	"PUT /v1/projects/{name}":                     operator,
	"DELETE /v1/projects/{name}":                  operator,
	"GET /v2/apps":                                reader,
	"POST /v2/apps":                               operator,
	"GET /v2/apps/{app_id}":                       reader,
	"PUT /v2/apps/{app_id}":                       operator,
	"DELETE /v2/apps/{app_id}":                    operator,
	"GET /v2/fns":                                 reader,
	"POST /v2/fns":                                operator,
	"GET /v2/fns/{fn_id}":                         reader,
	"PUT /v2/fns/{fn_id}":                         operator,
	"DELETE /v2/fns/{fn_id}":                      operator,
	"GET /v2/fns/{fn_id}/calls":                   reader,
	"GET /v2/fns/{fn_id}/calls/{call_id}":         reader,
	"GET /v2/fns/{fn_id}/calls/{call_id}/log":     reader,
	"GET /v2/fns/{fn_id}/calls/{call_id}/result":  reader,
	"GET /v2/triggers":                            reader,
	"POST /v2/triggers":                           operator,
	"GET /v2/triggers/{trigger_id}":               reader,
	"PUT /v2/triggers/{trigger_id}":               operator,
	"DELETE /v2/triggers/{trigger_id}":            operator,
	"POST /invoke/{fn_id}":                        invoke,
	"POST /invoke/{fn_id}/async":                  invoke,
	"GET /t/{app_name}/{source...}":               trigger,
	"POST /t/{app_name}/{source...}":              trigger,
	"PUT /t/{app_name}/{source...}":               trigger,
	"PATCH /t/{app_name}/{source...}":             trigger,
	"DELETE /t/{app_name}/{source...}":            trigger,
	"OPTIONS /t/{app_name}/{source...}":           trigger,
	// Agent releases and rollouts (package upgrade).
	"POST /v1/agent-releases":             admin,
	"GET /v1/agent-releases":              reader,
	"DELETE /v1/agent-releases/{version}": admin,
	"POST /v1/rollouts":                   operator,
	"GET /v1/rollouts":                    reader,
	"GET /v1/rollouts/{id}":               reader,
}

// consoleAccess is the least role of every web console route (package
// console); the console checks it against the session's credential before
// it calls the API, which checks the API route's own role again. Sign-in
// and the static files need no session.
var consoleAccess = map[string]httpapi.Role{
	"GET /ui/{$}":                               httpapi.RoleReader,
	"GET /ui/static/":                           "",
	"GET /ui/signin":                            "",
	"POST /ui/signin":                           "",
	"POST /ui/signout":                          httpapi.RoleReader,
	"GET /ui/fleet":                             httpapi.RoleReader,
	"GET /ui/fleet/gpus.png":                    httpapi.RoleReader,
	"GET /ui/nodes/{id}":                        httpapi.RoleReader,
	"POST /ui/nodes/{id}/{action}":              httpapi.RoleOperator,
	"GET /ui/runs":                              httpapi.RoleReader,
	"GET /ui/runs/{id}":                         httpapi.RoleReader,
	"GET /ui/runs/{id}/log":                     httpapi.RoleReader,
	"POST /ui/runs/{id}/cancel":                 httpapi.RoleSubmitter,
	"POST /ui/runs/{id}/resubmit":               httpapi.RoleSubmitter,
	"GET /ui":                                   "",
	"GET /ui/functions":                         httpapi.RoleReader,
	"GET /ui/functions/{fn_id}":                 httpapi.RoleReader,
	"GET /ui/functions/{fn_id}/calls/{call_id}": httpapi.RoleReader,
	"GET /ui/artifacts":                         httpapi.RoleReader,
	"GET /ui/audit":                             httpapi.RoleAdmin,
}

// publicRoutes is the public API, every route behind an API credential
// with the access the table above gives it: Mercator's own (v1Routes) and
// the Fn-compatible ones (package function). openapi.json documents
// exactly these (a test checks it).
func (s *Server) publicRoutes() []httpapi.Route {
	routes := append(s.v1Routes(), s.fn.Routes()...)
	for i := range routes {
		a, ok := routeAccess[routes[i].Pattern]
		if !ok {
			panic("controlplane: route " + routes[i].Pattern + " has no entry in the access table (routes.go)")
		}
		routes[i].Access = a
	}
	return routes
}

// v1Routes is Mercator's own API, whose errors take api.Error's shape.
func (s *Server) v1Routes() []httpapi.Route {
	return append([]httpapi.Route{
		{Pattern: "POST /v1/runs", Handler: s.submitRun},
		{Pattern: "POST /v1/runs/batch", Handler: s.submitRuns},
		{Pattern: "GET /v1/runs", Handler: s.listRuns},
		{Pattern: "GET /v1/runs/{id}", Handler: project.ScopeRun(s.store, "read runs", s.getRun)},
		{Pattern: "POST /v1/runs/{id}/cancel", Handler: project.ScopeRun(s.store, "cancel runs", s.cancelRun)},
		{Pattern: "GET /v1/runs/{id}/wait", Handler: project.ScopeRun(s.store, "read runs", s.waitRun)},
		{Pattern: "GET /v1/runs/{id}/logs", Handler: project.ScopeRun(s.store, "read the logs", s.runLogs)},
		{Pattern: "GET /v1/nodes", Handler: s.listNodes},
		{Pattern: "GET /v1/nodes/{id}", Handler: s.getNode},
		{Pattern: "DELETE /v1/nodes/{id}", Handler: s.removeNode},
		{Pattern: "POST /v1/nodes/{id}/invitations", Handler: s.inviteNode},
		{Pattern: "POST /v1/nodes/{id}/cordon", Handler: s.cordonNode},
		{Pattern: "POST /v1/nodes/{id}/labels", Handler: s.labelNode},
		{Pattern: "POST /v1/nodes/{id}/uncordon", Handler: s.uncordonNode},
		{Pattern: "POST /v1/nodes/{id}/drain", Handler: s.drainNode},
		{Pattern: "POST /v1/nodes/{id}/gpus/{uuid}/clear", Handler: s.clearGPUDispute},
		{Pattern: "POST /v1/nodes/{id}/gpus/{uuid}/cordon", Handler: s.cordonGPU},
		{Pattern: "POST /v1/nodes/{id}/gpus/{uuid}/uncordon", Handler: s.uncordonGPU},
	}, slices.Concat(s.artifacts.Routes(), s.registries.Routes(), s.projects.Routes(), s.access.Routes(), s.upgrades.Routes())...)
}

// writeAuthError writes a refusal of an API credential on a v1 route.
func writeAuthError(w http.ResponseWriter, _ *http.Request, err error) { httpapi.WriteError(w, err) }

// Handler returns the HTTP handler for the public API and the node protocol.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	// Public API. /metrics needs a reader credential unless the server was
	// started with MetricsPublic.
	metricsHandler := s.metrics.Handler()
	if !s.cfg.MetricsPublic {
		metricsHandler = s.audit.Wrap(s.tokens.Require(httpapi.Route{Pattern: "GET /metrics", Access: reader}, metricsHandler, writeAuthError), false)
	}
	// Every route is limited by its class (package limits, limits.Of);
	// ones without a credential count against the caller's address.
	byAddr := s.limiter.Handle(mux)
	byAddr("GET /metrics", metricsHandler)
	byAddr("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) }))
	byAddr("GET /v1/openapi.json", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openAPI)
	}))
	v1 := map[string]bool{}
	for _, rt := range s.v1Routes() {
		v1[rt.Pattern] = true
	}
	for _, rt := range s.publicRoutes() {
		fail := function.WriteAuthError
		if v1[rt.Pattern] {
			fail = writeAuthError
		}
		// Invocations are not audited call by call (httpapi/audit.go);
		// their refusals are. The limits count the credential Require
		// proved, so they come after it.
		mux.Handle(rt.Pattern, s.audit.Wrap(s.tokens.Require(rt, s.limiter.Route(rt.Pattern, http.HandlerFunc(rt.Handler)), fail), rt.Access.Invoker))
	}
	// Node protocol. Enrollment and renewal are audited; the hot calls
	// (events, logs, the session stream) only when refused (nodeAuth).
	mux.Handle("POST "+nodeproto.PathEnroll, s.audit.Wrap(s.limiter.Route("POST "+nodeproto.PathEnroll, http.HandlerFunc(s.enroll)), false))
	nodeRoute := s.limiter.HandleNode(mux, s.nodeAuth)
	nodeRoute("POST "+nodeproto.PathRenew, s.renew)
	nodeRoute("POST "+nodeproto.PathSession, s.session)
	nodeRoute("POST "+nodeproto.PathEvents, s.events)
	nodeRoute("POST "+nodeproto.PathLogs, s.nodeLogs)
	for _, rt := range s.fn.NodeRoutes() { // the calls paths, call_log answers
		nodeRoute(rt.Pattern, rt.Handler)
	}
	// The web console (package console), over the API in process.
	var root http.Handler
	s.newConsole(&root).Register(consoleAccess, byAddr)
	// Fn's API answers what none of its routes take in its own shape, and
	// /version as Fn's does (without a credential, as there).
	byAddr("GET /version", http.HandlerFunc(s.fn.Version))
	for _, p := range function.FallbackPrefixes {
		byAddr(p, s.fn.Fallback())
	}
	// Signed content reads (package artifact): the signature is the credential.
	byAddr("GET "+content.ReadPath+"{digest}", http.HandlerFunc(s.artifacts.ServeContent))
	byAddr("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, &failure.Error{Kind: failure.ErrNotFound, Message: fmt.Sprintf("no route %s %s; see /v1/openapi.json", r.Method, r.URL.Path)})
	}))
	root = httpapi.Recoverer(s.log, s.metrics.Instrument(mux))
	return root
}
