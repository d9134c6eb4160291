// Package registry holds the control plane's registry credentials: stored
// sealed, never returned, and handed to a node only inside the one command
// that pulls with them.
//
// The password is sealed (Sealer, the control plane's key) with the registry host as associated
// data, so a database copied elsewhere holds nothing usable and a sealed
// password cannot be moved to another host's record.
//
// A stored operation never carries the credential: the launch is stored
// with an empty RegistryAuth, and the session stream attaches the
// credential for the image's registry as it sends the command (Auth, from
// package controlplane's outbound).
// The node passes it to the daemon as the X-Registry-Auth header of one pull
// and keeps it nowhere. Tag resolution at submit uses the same credential
// (Credentials, through daemon.refResolver), and so do functions' pulls.
//
// Only package controlplane may import it.
package registry

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/expiring"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/internal/sealing"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/imageref"
	"github.com/mercator/mercator/store"
)

// registrySealingData binds a sealed password to its registry host and,
// outside the default project, to its project, so that a sealed password
// cannot be moved to another project's record either. The default
// project's binding is the host alone, as every credential's was before
// credentials belonged to projects, so those still open.
func registrySealingData(project, host string) []byte {
	if project = api.ProjectOf(project); project != api.DefaultProject {
		host += "\x00" + project
	}
	return []byte("mercator registry credential\x00" + host)
}

// normalizeRegistryHost is the registry as image references name it: a
// host[:port], lower case, with Docker Hub's aliases folded into docker.io.
func normalizeRegistryHost(h string) (string, error) {
	h = strings.ToLower(strings.TrimSpace(h))
	if strings.Contains(h, "://") || strings.ContainsAny(h, "/@ \t") || h == "" {
		return "", failure.Invalid("host", "%q is not a registry host: write the host[:port] image references start with, such as ghcr.io or 127.0.0.1:5000", h)
	}
	if host, port, err := net.SplitHostPort(h); err == nil && (host == "" || port == "") {
		return "", failure.Invalid("host", "%q is not a registry host[:port]", h)
	}
	switch h {
	case "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com":
		h = "docker.io"
	}
	return h, nil
}

func registryView(c store.RegistryCredential) api.Registry {
	return api.Registry{Project: api.ProjectOf(c.Project), Host: c.Host, Username: c.Username, CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt}
}

// putRegistry stores (or replaces) the credential of a registry host:
// POST /v1/registries. The answer never holds the password.
func (s *Service) putRegistry(w http.ResponseWriter, r *http.Request) {
	var req api.RegistryCredentialRequest
	if err := httpapi.Decode(r, httpapi.MaxBody, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	host, err := normalizeRegistryHost(req.Host)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if req.Username == "" || req.Password == "" {
		httpapi.WriteError(w, failure.Invalid("password", "a username and a password (or token) are both required"))
		return
	}
	proj, err := project.Named(r, req.Project, "add registry credentials")
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	sealed, err := s.sealer.Seal(registrySealingData(proj, host), req.Password)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	now := s.now()
	var out store.RegistryCredential
	status := http.StatusCreated
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		out = store.RegistryCredential{Project: proj, Host: host, Username: req.Username, Sealed: sealed, CreatedAt: now, UpdatedAt: now}
		status = http.StatusCreated
		if err := project.Exists(tx, "project", proj); err != nil {
			return err
		}
		if old, err := tx.GetRegistryCredential(proj, host); err == nil {
			out.CreatedAt, status = old.CreatedAt, http.StatusOK
		} else if !errors.Is(err, failure.ErrNotFound) {
			return err
		}
		return tx.PutRegistryCredential(out)
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.forget(proj, host)
	s.log.Info("registry credential stored", "project", proj, "host", host, "username", req.Username)
	httpapi.WriteJSON(w, status, registryView(out))
}

// listRegistries answers GET /v1/registries: the credentials of the
// projects the caller may see (?project= keeps one), by project and host.
func (s *Service) listRegistries(w http.ResponseWriter, r *http.Request) {
	out := api.RegistryList{Registries: []api.Registry{}}
	keep, err := project.Filter(r, "list registry credentials")
	if err == nil {
		err = s.store.View(r.Context(), func(tx store.Tx) error {
			cs, err := tx.ListRegistryCredentials()
			out.Registries = out.Registries[:0]
			for _, c := range cs {
				if keep(c.Project) {
					out.Registries = append(out.Registries, registryView(c))
				}
			}
			return err
		})
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// deleteRegistry removes a project's credential for a host: DELETE
// /v1/registries/{host}?project= (the caller's project when it names
// none). It answers with what was removed (without the password).
func (s *Service) deleteRegistry(w http.ResponseWriter, r *http.Request) {
	host, err := normalizeRegistryHost(r.PathValue("host"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	proj, err := project.Named(r, r.URL.Query().Get("project"), "remove registry credentials")
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	var out store.RegistryCredential
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		var err error
		if out, err = tx.GetRegistryCredential(proj, host); err != nil {
			return err
		}
		return tx.DeleteRegistryCredential(proj, host)
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.forget(proj, host)
	s.log.Info("registry credential removed", "project", proj, "host", host)
	httpapi.WriteJSON(w, http.StatusOK, registryView(out))
}

// registryLookup is what the store answered for a project's registry
// host: found or not, both cached (Service.creds, keyed by credKey). Every
// launch and image command handed to a node carries its registry's
// credential when one is stored (outbound), so without the cache a fleet
// busy with placements read the store once per command, and those reads
// queued for the store's few connections. A credential changed on this
// replica is forgotten at once (putRegistry, deleteRegistry); one changed
// on another replica is seen here within registryCredTTL.
type registryLookup struct {
	cred  store.RegistryCredential
	found bool
}

// registryCredTTL bounds how long another replica's change may go unseen.
const registryCredTTL = 5 * time.Second

// credKey is a project's host in Service.creds.
func credKey(project, host string) string { return api.ProjectOf(project) + "\x00" + host }

// forget drops what the caches hold about project's host: its credential
// was just changed.
func (s *Service) forget(project, host string) {
	s.creds.Forget(credKey(project, host))
	s.held.Forget(host)
}

// registryCredential returns the username and password project holds for
// host; ok is false when it holds none (or it cannot be opened, which is
// logged). Another project's credential for the host is never used.
func (s *Service) registryCredential(ctx context.Context, proj, host string) (user, password string, ok bool) {
	host, err := normalizeRegistryHost(host)
	if err != nil {
		return "", "", false
	}
	proj = api.ProjectOf(proj)
	now := time.Now()
	key := credKey(proj, host)
	cached, fresh, gen := s.creds.Get(key, now, registryCredTTL)
	c, found := cached.cred, cached.found
	if !fresh {
		err = s.store.View(ctx, func(tx store.Tx) error {
			var err error
			c, err = tx.GetRegistryCredential(proj, host)
			return err
		})
		if err != nil && !errors.Is(err, failure.ErrNotFound) {
			s.log.Warn("reading registry credential", "project", proj, "host", host, "err", err)
			return "", "", false
		}
		found = err == nil
		s.creds.Put(key, registryLookup{c, found}, gen, now)
	}
	if !found {
		return "", "", false
	}
	password, err = s.sealer.Unseal(registrySealingData(proj, host), c.Sealed)
	if errors.Is(err, sealing.ErrUnsealable) {
		err = fmt.Errorf("the stored credential of project %s for %s %w: add it again", proj, host, err)
	}
	if err != nil {
		s.log.Warn("registry credential unusable", "project", proj, "host", host, "err", err)
		return "", "", false
	}
	return c.Username, password, true
}

// Held says whether any project holds a credential for image's registry:
// a launch whose image has none needs no credential, so the session stream
// reads nothing more for it (cached as credentials are).
func (s *Service) Held(ctx context.Context, image string) bool {
	ref, err := imageref.Parse(image)
	if err != nil {
		return false
	}
	host, err := normalizeRegistryHost(ref.Registry())
	if err != nil {
		return false
	}
	now := time.Now()
	held, fresh, gen := s.held.Get(host, now, registryCredTTL)
	if fresh {
		return held
	}
	err = s.store.View(ctx, func(tx store.Tx) error {
		cs, err := tx.ListRegistryCredentials()
		held = slices.ContainsFunc(cs, func(c store.RegistryCredential) bool { return c.Host == host })
		return err
	})
	if err != nil {
		s.log.Warn("reading registry credentials", "host", host, "err", err)
		return true // let the lookup by project decide
	}
	s.held.Put(host, held, gen, now)
	return held
}

// Auth is the Engine API's X-Registry-Auth value for project pulling
// image, or "" when the project holds no credential for its registry.
func (s *Service) Auth(ctx context.Context, project, image string) string {
	ref, err := imageref.Parse(image)
	if err != nil {
		return ""
	}
	user, password, ok := s.registryCredential(ctx, project, ref.Registry())
	if !ok {
		return ""
	}
	raw, _ := json.Marshal(struct {
		Username      string `json:"username"`
		Password      string `json:"password"`
		ServerAddress string `json:"serveraddress"`
	}{user, password, ref.Registry()})
	return base64.URLEncoding.EncodeToString(raw)
}

// Credentials is what tag resolution at submit asks for a registry's
// credential (imageref.Resolver.Credentials, with a context): the username
// and password the submitting project (ProjectFrom(ctx)) holds for host;
// ok is false when it holds none (or it cannot be opened, which is logged).
func (s *Service) Credentials(ctx context.Context, host string) (user, password string, ok bool) {
	return s.registryCredential(ctx, ProjectFrom(ctx), host)
}

// projectKey carries the project an image is resolved for (WithProject).
type projectKey struct{}

// WithProject is ctx for resolving an image's tag on behalf of project:
// the resolver asks Credentials, which reads it (ProjectFrom), so a tag is
// resolved with that project's credential only.
func WithProject(ctx context.Context, project string) context.Context {
	return context.WithValue(ctx, projectKey{}, project)
}

// ProjectFrom is the project WithProject put in ctx; "" (the default
// project) when none.
func ProjectFrom(ctx context.Context) string {
	p, _ := ctx.Value(projectKey{}).(string)
	return p
}

// Sealer seals and opens values with the control plane's key, bound to
// additional data ad; Unseal's error wraps sealing.ErrUnsealable for a
// value that does not open.
type Sealer interface {
	Seal(ad []byte, plain string) ([]byte, error)
	Unseal(ad, sealed []byte) (string, error)
}

// Service serves the registry credentials. Safe for concurrent use.
type Service struct {
	store  store.Store
	now    func() time.Time
	log    *slog.Logger
	sealer Sealer
	creds  expiring.Map[registryLookup] // by credKey
	held   expiring.Map[bool]           // by host: whether any project holds one (Held)
}

// New returns the registry credentials service; now is the clock (UTC).
func New(st store.Store, now func() time.Time, log *slog.Logger, sealer Sealer) *Service {
	return &Service{store: st, now: now, log: log, sealer: sealer}
}

// Routes are the public registry routes, each served behind an API
// credential.
func (s *Service) Routes() []httpapi.Route {
	return []httpapi.Route{
		{Pattern: "POST /v1/registries", Handler: s.putRegistry},
		{Pattern: "GET /v1/registries", Handler: s.listRegistries},
		{Pattern: "DELETE /v1/registries/{host}", Handler: s.deleteRegistry},
	}
}
