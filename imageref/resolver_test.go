package imageref

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/mercator/mercator/failure"
)

// startRegistry serves an in-memory OCI registry on loopback and returns its
// host:port. wrap, when non-nil, decorates the handler (for auth).
func startRegistry(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// pushImage pushes a random image to host/repo:tag and returns its digest.
func pushImage(t *testing.T, ref string, opts ...remote.Option) v1.Hash {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, opts...); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustParse(t *testing.T, s string) Ref {
	t.Helper()
	r, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestResolveTag(t *testing.T) {
	host := startRegistry(t, nil)
	want := pushImage(t, host+"/hello:1")

	var res Resolver
	got, err := res.Resolve(t.Context(), mustParse(t, host+"/hello:1"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest() != want.String() || !got.Pinned() || got.Tag() != "" {
		t.Fatalf("Resolve = %v (digest %q tag %q), want digest %s and no tag", got, got.Digest(), got.Tag(), want)
	}
	if got.String() != host+"/hello@"+want.String() {
		t.Fatalf("Resolve = %q, want %q", got, host+"/hello@"+want.String())
	}
}

func TestResolveIndexPinsIndexDigest(t *testing.T) {
	host := startRegistry(t, nil)
	idx, err := random.Index(256, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(host+"/multi:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatal(err)
	}
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	var res Resolver
	got, err := res.Resolve(t.Context(), mustParse(t, host+"/multi:1"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest() != want.String() {
		t.Fatalf("Resolve = %v, want the index digest %s", got, want)
	}
}

func TestResolveMissingTag(t *testing.T) {
	host := startRegistry(t, nil)
	pushImage(t, host+"/hello:1")

	var res Resolver
	ref := mustParse(t, host+"/hello:nope")
	_, err := res.Resolve(t.Context(), ref)
	if !errors.Is(err, failure.ErrInvalid) {
		t.Fatalf("Resolve(missing tag) = %v, want kind invalid", err)
	}
	want := "image " + host + "/hello:nope not found in registry " + host
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `tag "nope"`) {
		t.Fatalf("Resolve(missing tag) = %q, want it to contain %q and the tag", err, want)
	}

	// A repository that does not exist at all reads the same way.
	_, err = res.Resolve(t.Context(), mustParse(t, host+"/nothing:1"))
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "not found in registry") {
		t.Fatalf("Resolve(missing repository) = %v, want kind invalid, not found", err)
	}
}

func TestResolveMissingDigest(t *testing.T) {
	host := startRegistry(t, nil)
	pushImage(t, host+"/hello:1")

	var res Resolver
	ref := mustParse(t, host+"/hello@sha256:"+hex64)
	_, err := res.Resolve(t.Context(), ref)
	if !errors.Is(err, failure.ErrInvalid) {
		t.Fatalf("Resolve(missing digest) = %v, want kind invalid", err)
	}
	if !strings.Contains(err.Error(), "not found in registry "+host) || !strings.Contains(err.Error(), "sha256:"+hex64) {
		t.Fatalf("Resolve(missing digest) = %q, want not found with the digest", err)
	}
}

func TestResolvePinnedIsVerified(t *testing.T) {
	host := startRegistry(t, nil)
	d := pushImage(t, host+"/hello:1")

	var res Resolver
	// The tag on a pinned reference is ignored: "other" does not exist.
	ref := mustParse(t, host+"/hello:other@"+d.String())
	got, err := res.Resolve(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != host+"/hello@"+d.String() {
		t.Fatalf("Resolve(pinned) = %q, want %q", got, host+"/hello@"+d.String())
	}
}

func TestResolveUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := ln.Addr().String()
	ln.Close() // nothing listens there now

	var res Resolver
	_, err = res.Resolve(t.Context(), mustParse(t, host+"/hello:1"))
	if !errors.Is(err, failure.ErrUnavailable) {
		t.Fatalf("Resolve(closed port) = %v, want kind unavailable", err)
	}
	if !strings.Contains(err.Error(), "registry "+host) {
		t.Fatalf("Resolve(closed port) = %q, want it to name the host %s", err, host)
	}
}

func TestResolveContextEnded(t *testing.T) {
	host := startRegistry(t, nil)
	pushImage(t, host+"/hello:1")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var res Resolver
	_, err := res.Resolve(ctx, mustParse(t, host+"/hello:1"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Resolve(cancelled ctx) = %v, want context.Canceled", err)
	}
}

func TestResolveBasicAuth(t *testing.T) {
	const user, pass = "alice", "s3cret"
	host := startRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, p, ok := r.BasicAuth()
			if !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	want := pushImage(t, host+"/private:1", remote.WithAuth(&authn.Basic{Username: user, Password: pass}))
	ref := mustParse(t, host+"/private:1")

	var asked []string
	res := Resolver{Credentials: func(h string) (string, string, bool) {
		asked = append(asked, h)
		return user, pass, true
	}}
	got, err := res.Resolve(t.Context(), ref)
	if err != nil {
		t.Fatalf("Resolve with credentials: %v", err)
	}
	if got.Digest() != want.String() {
		t.Fatalf("Resolve = %v, want digest %s", got, want)
	}
	if len(asked) != 1 || asked[0] != host {
		t.Fatalf("credentials asked for %q, want [%s]", asked, host)
	}

	var anon Resolver
	_, err = anon.Resolve(t.Context(), ref)
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "refused access") ||
		!strings.Contains(err.Error(), "no credentials are stored for "+host) {
		t.Fatalf("Resolve without credentials = %v, want invalid, refused access, no credentials", err)
	}

	noneStored := Resolver{Credentials: func(string) (string, string, bool) { return "", "", false }}
	_, err = noneStored.Resolve(t.Context(), ref)
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "no credentials are stored") {
		t.Fatalf("Resolve with no stored credentials = %v, want invalid, no credentials", err)
	}

	wrong := Resolver{Credentials: func(string) (string, string, bool) { return user, "wrong", true }}
	_, err = wrong.Resolve(t.Context(), ref)
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "credentials stored for "+host+" were refused") {
		t.Fatalf("Resolve with wrong credentials = %v, want invalid, credentials refused", err)
	}
}

// schemeRecorder records the scheme of each request and fails it, so no
// network is touched.
type schemeRecorder struct{ schemes []string }

func (s *schemeRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	s.schemes = append(s.schemes, r.URL.Scheme+"://"+r.URL.Host)
	return nil, errors.New("recorded")
}

func TestResolveSchemes(t *testing.T) {
	for _, tc := range []struct {
		ref       string
		insecure  []string
		wantPlain bool
	}{
		// go-containerregistry alone would use plain HTTP for RFC 1918.
		{"10.1.2.3:5000/hello:1", nil, false},
		{"registry.local/hello:1", nil, false},
		{"registry.example.com/hello:1", nil, false},
		{"10.1.2.3:5000/hello:1", []string{"10.1.2.3:5000"}, true},
		{"10.1.2.3:5000/hello:1", []string{"10.1.2.3"}, true},
		{"10.1.2.3:5000/hello:1", []string{"10.1.2.3:6000"}, false},
		{"registry.example.com/hello:1", []string{"REGISTRY.example.com"}, true},
	} {
		rec := &schemeRecorder{}
		res := Resolver{Transport: rec, Insecure: tc.insecure}
		_, err := res.Resolve(t.Context(), mustParse(t, tc.ref))
		if err == nil {
			t.Fatalf("%s: Resolve succeeded through a failing transport", tc.ref)
		}
		if len(rec.schemes) == 0 {
			t.Fatalf("%s: no request made", tc.ref)
		}
		for _, s := range rec.schemes {
			if plain := strings.HasPrefix(s, "http://"); plain && !tc.wantPlain {
				t.Errorf("%s insecure=%v: request to %s in plain HTTP", tc.ref, tc.insecure, s)
			}
		}
		if tc.wantPlain && !strings.Contains(strings.Join(rec.schemes, " "), "http://") {
			t.Errorf("%s insecure=%v: requests %v, want plain HTTP", tc.ref, tc.insecure, rec.schemes)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost":            true,
		"LOCALHOST:5000":       true,
		"127.0.0.1:5000":       true,
		"127.1.2.3":            true,
		"[::1]:5000":           true,
		"::1":                  true,
		"10.0.0.1:5000":        false,
		"192.168.1.1":          false,
		"registry.example.com": false,
		"localhost.example":    false,
		"docker.io":            false,
	} {
		if got := IsLoopback(host); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", host, got, want)
		}
	}
}
