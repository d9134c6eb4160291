package console

import (
	"context"
	"embed"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/internal/inprocess"
)

// API is what the console reads and changes, as one credential: the
// subset of the public API's client (*client.Client) the pages use. Every
// call is authorized by the control plane as that credential's.
type API interface {
	ListNodes(ctx context.Context) (api.NodeList, error)
	ListNodesPage(ctx context.Context, opts client.NodePageOptions) (api.NodeList, error)
	GetNode(ctx context.Context, id string) (api.Node, error)
	CordonNode(ctx context.Context, nodeID string) (api.Node, error)
	UncordonNode(ctx context.Context, nodeID string) (api.Node, error)
	DrainNode(ctx context.Context, nodeID string, deadline time.Duration) (api.Node, error)
	ListRuns(ctx context.Context, opts client.ListRunsOptions) (api.RunList, error)
	GetRun(ctx context.Context, id string) (api.Run, error)
	WaitRunFunc(ctx context.Context, id string, observe func(api.Run)) (api.Run, error)
	SubmitRun(ctx context.Context, spec api.RunSpec, opts ...client.SubmitOption) (api.Run, error)
	CancelRun(ctx context.Context, id string) (api.Run, error)
	Logs(ctx context.Context, id string, follow bool, w io.Writer) error
	ListApps(ctx context.Context) ([]api.App, error)
	ListFns(ctx context.Context, appID string) ([]api.Fn, error)
	ListTriggers(ctx context.Context, appID, fnID string) ([]api.Trigger, error)
	GetFn(ctx context.Context, id string) (api.Fn, error)
	ListCalls(ctx context.Context, fnID string, perPage int) (api.FnCallList, error)
	CallLog(ctx context.Context, fnID, callID string) (string, error)
	ListArtifacts(ctx context.Context, name string) (api.ArtifactList, error)
	ListAudit(ctx context.Context, opts client.AuditOptions) (api.AuditList, error)
}

// Authenticator proves a credential: *httpapi.Tokens. The console asks it
// on every request, so a removed or expired token ends its sessions.
type Authenticator interface {
	Check(ctx context.Context, tok string) (httpapi.Caller, error)
}

// Config is what a Console needs. APIFor returns the API as the credential
// tok, for the browser request r (whose address the audit log records).
type Config struct {
	Auth   Authenticator
	APIFor func(tok string, r *http.Request) API
	Now    func() time.Time
	Log    *slog.Logger
	// Sessions bounds the sessions held (DefaultSessions when 0).
	Sessions int
	// Stats is the replica's series and the nodes' function containers
	// (stats.go); nil shows no charts and no containers.
	Stats Stats
}

// InProcess is Config.APIFor for a console served beside the API it
// calls: the API's client (*client.Client) over an in-process transport
// onto *api, the control plane's whole handler, with the browser's address
// as the caller's (the audit log records it).
func InProcess(api *http.Handler) func(tok string, r *http.Request) API {
	return func(tok string, r *http.Request) API {
		return client.New("http://console.in-process", tok, &http.Client{Transport: inprocess.Transport{Handler: api, RemoteAddr: r.RemoteAddr}})
	}
}

// Route is one console route: a ServeMux pattern, its handler, and the
// least role that may use it. Package controlplane declares the roles
// (routes.go) and the console enforces them before calling the API, which
// enforces them again.
type Route struct {
	Pattern string
	Handler http.Handler
	Role    httpapi.Role
}

// Console serves the web console. Safe for concurrent use.
type Console struct {
	cfg      Config
	sessions *sessions
	pages    *template.Template
}

//go:embed assets
var assets embed.FS

// New returns a console over cfg.
func New(cfg Config) *Console {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Sessions <= 0 {
		cfg.Sessions = DefaultSessions
	}
	t := template.Must(template.New("").Funcs(funcs(cfg.Now)).ParseFS(assets, "assets/*.html"))
	return &Console{cfg: cfg, sessions: newSessions(cfg.Sessions, cfg.Now), pages: t}
}

// Routes lists the console's routes with their handlers; package
// controlplane sets each one's Role from its table and serves them through
// Handle.
func (c *Console) Routes() []Route {
	static, _ := fs.Sub(assets, "assets")
	files := http.FileServerFS(static)
	return []Route{
		{Pattern: "GET /ui/{$}", Handler: c.page(c.fleet)},
		{Pattern: "GET /ui", Handler: http.RedirectHandler("/ui/", http.StatusMovedPermanently)},
		{Pattern: "GET /ui/static/", Handler: http.StripPrefix("/ui/static/", files)},
		{Pattern: "GET /ui/signin", Handler: http.HandlerFunc(c.signinPage)},
		{Pattern: "POST /ui/signin", Handler: http.HandlerFunc(c.signin)},
		{Pattern: "POST /ui/signout", Handler: c.page(c.signout)},
		{Pattern: "GET /ui/fleet", Handler: c.page(c.fleet)},
		{Pattern: "GET /ui/fleet/gpus.png", Handler: c.page(c.gpuPicture)},
		{Pattern: "GET /ui/nodes/{id}", Handler: c.page(c.node)},
		{Pattern: "POST /ui/nodes/{id}/{action}", Handler: c.action(c.nodeAction)},
		{Pattern: "GET /ui/runs", Handler: c.page(c.runs)},
		{Pattern: "GET /ui/runs/{id}", Handler: c.page(c.run)},
		{Pattern: "GET /ui/runs/{id}/log", Handler: c.page(c.runLog)},
		{Pattern: "POST /ui/runs/{id}/cancel", Handler: c.action(c.cancel)},
		{Pattern: "POST /ui/runs/{id}/resubmit", Handler: c.action(c.resubmit)},
		{Pattern: "GET /ui/functions", Handler: c.page(c.functions)},
		{Pattern: "GET /ui/functions/{fn_id}", Handler: c.page(c.function)},
		{Pattern: "GET /ui/functions/{fn_id}/calls/{call_id}", Handler: c.page(c.callLog)},
		{Pattern: "GET /ui/artifacts", Handler: c.page(c.artifacts)},
		{Pattern: "GET /ui/audit", Handler: c.page(c.audit)},
	}
}

// Register serves every console route through serve (the control plane's
// limiter onto its mux), each with the least role roles declares for its
// pattern. A route missing from roles panics: none is served undeclared.
func (c *Console) Register(roles map[string]httpapi.Role, serve func(pattern string, h http.Handler)) {
	for _, rt := range c.Routes() {
		role, ok := roles[rt.Pattern]
		if !ok {
			panic("console: route " + rt.Pattern + " has no declared role (controlplane/routes.go, consoleAccess)")
		}
		rt.Role = role
		serve(rt.Pattern, c.Handle(rt))
	}
}

// Handle wraps a route's handler with the console's security headers and,
// but for the sign-in page and the static files, a session whose
// credential's role is at least rt.Role.
func (c *Console) Handle(rt Route) http.Handler {
	h := rt.Handler
	switch rt.Pattern {
	case "GET /ui/static/", "GET /ui/signin", "POST /ui/signin", "GET /ui":
	default:
		h = c.requireSession(rt.Role, h)
	}
	return secure(h)
}

// secure sets the headers every console answer carries: scripts only from
// the console's own files (no inline script, so an injected tag does not
// run), no framing (clickjacking), no content sniffing, no referrer
// leaking run IDs, and no caching of pages that show fleet data.
func secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "same-origin")
		if strings.HasPrefix(r.URL.Path, "/ui/static/") {
			hd.Set("Cache-Control", "public, max-age=300")
		} else {
			hd.Set("Cache-Control", "no-store")
		}
		h.ServeHTTP(w, r)
	})
}
