package imageref

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/mercator/mercator/failure"
)

// CredentialsFunc returns the username and password to present to the
// registry at registryHost (a Ref.Registry value such as "127.0.0.1:5000" or
// "docker.io"), and ok=false when none are stored, in which case the registry
// is asked anonymously.
type CredentialsFunc func(registryHost string) (username, password string, ok bool)

// Resolver pins image references by asking their registry for the manifest
// digest. The zero Resolver is usable: anonymous, HTTPS for every registry
// except loopback ones, remote.DefaultTransport. A Resolver is safe for
// concurrent use once its fields are set; do not change them afterwards.
//
// Plain HTTP is used for loopback registries (localhost, 127.0.0.0/8, ::1),
// as the Docker daemon does, and for those listed in Insecure; every other
// registry is reached over HTTPS only. (go-containerregistry on its own would
// also fall back to plain HTTP for RFC 1918 addresses and *.local names; the
// Resolver upgrades those requests to HTTPS instead, because the daemon that
// later pulls the image would refuse plain HTTP to them as well.)
type Resolver struct {
	// Credentials, when non-nil, is asked once per Resolve for the
	// reference's registry. Credentials are sent with HTTP basic auth (or
	// exchanged for a bearer token when the registry asks for one).
	Credentials CredentialsFunc

	// Insecure lists further registries to reach over plain HTTP. An entry
	// with a port ("10.0.0.5:5000") matches that registry exactly; an entry
	// without one ("registry.lan") matches that host on any port.
	Insecure []string

	// Transport carries the requests; nil means remote.DefaultTransport.
	Transport http.RoundTripper
}

// Resolve returns ref pinned to the digest of its manifest, as
// Name()@sha256:… with no tag.
//
// For a tagged ref it asks the registry (HEAD of the manifest, falling back
// to GET when the registry's HEAD answer lacks the digest) which manifest the
// tag names now. When that manifest is a multi-platform index, the index's
// digest is returned, not one platform's: the daemon that pulls it picks the
// platform of its own machine.
//
// An already pinned ref is verified, not trusted: the registry must have the
// manifest, so that a mistyped or garbage-collected digest fails at submit
// rather than on a node. Any tag on a pinned ref is ignored, as the daemon
// ignores it.
//
// Errors: a ref the registry does not have (404), or that it refuses to show
// (401/403, with or without credentials) yields failure.Invalid for the field
// "image" — the user can fix the reference or the stored credentials. (It is
// deliberately not failure.ErrUnauthorized, which means the caller's own
// Mercator credential is wrong.) A registry that cannot be reached, times out,
// or answers 429/5xx yields failure.Unavailable naming the host. ctx bounds
// the whole exchange; when it ends first, the returned error wraps ctx.Err().
func (r *Resolver) Resolve(ctx context.Context, ref Ref) (Ref, error) {
	if ref.registry == "" {
		return Ref{}, failure.Invalid(Field, "no image reference given; write it as registry/repository:tag, for example %s", exampleTagged)
	}
	host := ref.registry

	var opts []name.Option
	if r.plainHTTP(host) {
		opts = append(opts, name.Insecure)
	}
	reg, err := name.NewRegistry(host, opts...)
	if err != nil {
		return Ref{}, failure.Invalid(Field, "registry %q in image %s is not a valid host[:port]: %v", host, ref, err)
	}
	repo := reg.Repo(ref.repository)
	var target name.Reference
	if ref.Pinned() {
		target = repo.Digest(ref.digest)
	} else {
		target = repo.Tag(ref.tag)
	}

	auth := authn.Anonymous
	sentCredentials := false
	if r.Credentials != nil {
		if user, pass, ok := r.Credentials(host); ok {
			auth = &authn.Basic{Username: user, Password: pass}
			sentCredentials = true
		}
	}
	base := r.Transport
	if base == nil {
		base = remote.DefaultTransport
	}
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuth(auth),
		remote.WithTransport(&httpsOnly{base: base, plain: r.plainHTTP}),
		remote.WithUserAgent("mercator"),
	}

	desc, err := remote.Head(target, ropts...)
	if err != nil && isMalformedAnswer(err) {
		// Some registries answer HEAD without Docker-Content-Digest or
		// Content-Length; GET computes the digest from the manifest itself.
		var got *remote.Descriptor
		got, err = remote.Get(target, ropts...)
		if err == nil {
			desc = &got.Descriptor
		}
	}
	if err != nil {
		return Ref{}, r.classify(ctx, ref, err, sentCredentials)
	}
	d := desc.Digest.String()
	if ref.Pinned() && d != ref.digest {
		// remote.Head already checks this; keep the promise explicit.
		return Ref{}, failure.Invalid(Field, "image %s: registry %s answered with manifest %s instead", ref, host, d)
	}
	return ref.withDigest(d), nil
}

// classify maps an error from the remote package onto the failure kinds.
func (r *Resolver) classify(ctx context.Context, ref Ref, err error, sentCredentials bool) error {
	host := ref.registry
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("resolving image %s at registry %s: %w", ref, host, ctxErr)
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		what := "tag " + quote(ref.tag)
		if ref.Pinned() {
			what = "manifest " + ref.digest
		}
		switch code := terr.StatusCode; {
		case code == http.StatusNotFound:
			return failure.Invalid(Field, "image %s not found in registry %s: the registry has no %s in repository %q (HTTP 404); check the spelling, or push the image first",
				ref, host, what, ref.repository)
		case code == http.StatusUnauthorized || code == http.StatusForbidden:
			hint := "no credentials are stored for " + host + "; add them, then submit again"
			if sentCredentials {
				hint = "the credentials stored for " + host + " were refused or do not allow pulling " + ref.repository
			}
			return failure.Invalid(Field, "image %s: registry %s refused access (HTTP %d): %s", ref, host, code, hint)
		case code == http.StatusTooManyRequests || code >= 500:
			return failure.Unavailable("registry %s could not answer for image %s (HTTP %d), try again later: %v", host, ref, code, terr)
		case code >= 400:
			return failure.Invalid(Field, "image %s: registry %s rejected the request (HTTP %d): %v", ref, host, code, terr)
		}
		return failure.Unavailable("registry %s gave an unexpected answer for image %s: %v", host, ref, terr)
	}
	var nerr net.Error
	var uerr *url.Error
	var oerr *net.OpError
	var dnsErr *net.DNSError
	if errors.As(err, &nerr) || errors.As(err, &uerr) || errors.As(err, &oerr) || errors.As(err, &dnsErr) {
		return failure.Unavailable("registry %s is unreachable while resolving image %s: %v", host, ref, err)
	}
	return failure.Unavailable("registry %s: resolving image %s failed: %v", host, ref, err)
}

// isMalformedAnswer reports whether err came from a registry that answered,
// but not in the shape remote.Head needs (rather than refusing or being
// unreachable), so that a GET is worth trying.
func isMalformedAnswer(err error) bool {
	var terr *transport.Error
	if errors.As(err, &terr) {
		return false
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return false
	}
	var nerr net.Error
	if errors.As(err, &nerr) {
		return false
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// plainHTTP reports whether the registry at host (host[:port]) may be spoken
// to over plain HTTP.
func (r *Resolver) plainHTTP(host string) bool {
	if IsLoopback(host) {
		return true
	}
	h := hostOnly(host)
	for _, entry := range r.Insecure {
		if strings.EqualFold(entry, host) {
			return true
		}
		if !hasPort(entry) && strings.EqualFold(strings.Trim(entry, "[]"), h) {
			return true
		}
	}
	return false
}

// IsLoopback reports whether host (host[:port], IPv6 literals in brackets)
// names this machine's loopback interface: "localhost", 127.0.0.0/8 or ::1.
// Such registries are spoken to over plain HTTP.
func IsLoopback(host string) bool {
	h := hostOnly(host)
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// hostOnly strips the port and IPv6 brackets from host[:port].
func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	return strings.Trim(host, "[]")
}

func hasPort(host string) bool {
	_, _, err := net.SplitHostPort(host)
	return err == nil
}

func quote(s string) string { return fmt.Sprintf("%q", s) }

// httpsOnly upgrades plain-HTTP requests to HTTPS unless the target host may
// be spoken to in the clear. go-containerregistry decides the scheme from its
// own heuristics (RFC 1918, *.local); this keeps the Resolver's narrower rule.
type httpsOnly struct {
	base  http.RoundTripper
	plain func(host string) bool
}

func (t *httpsOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !t.plain(req.URL.Host) {
		req = req.Clone(req.Context())
		req.URL.Scheme = "https"
	}
	return t.base.RoundTrip(req)
}
