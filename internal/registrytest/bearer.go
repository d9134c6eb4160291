package registrytest

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

// BearerService is the service name the registry's challenges and its
// tokens carry, as "registry.docker.io" does for Docker Hub.
const BearerService = "mercator-test-registry"

// BearerOptions configure StartBearer.
type BearerOptions struct {
	// User and Password are the one account the token endpoint accepts.
	User, Password string
	// TTL is how long an issued token is valid; zero means one minute
	// (Docker Hub's are five). Short, so a test can show an expired token
	// refused.
	TTL time.Duration
	// Now is the clock tokens are issued and checked against; nil means
	// time.Now.
	Now func() time.Time
}

// BearerRegistry is a registry guarded as Docker Hub, ghcr.io and Harbor
// guard theirs: a request without a token is answered 401 with
//
//	WWW-Authenticate: Bearer realm="http://HOST/token",service="mercator-test-registry",scope="repository:NAME:pull"
//
// the token endpoint (GET with the Basic credential, or POST with an OAuth2
// password grant, as containerd sends) checks the account and issues a
// token for the requested scopes, signed with a key of this registry's
// own (HMAC-SHA256) and valid for TTL; and the registry serves a request
// only with a valid, unexpired token whose scope covers the request's
// repository and action (pull for GET and HEAD, push for anything else).
// The account may pull and push every repository.
//
// Its counters let a test prove the bearer path was taken. Safe for
// concurrent use.
type BearerRegistry struct {
	// Host is "127.0.0.1:PORT", the part image references start with.
	Host string

	opts  BearerOptions
	key   []byte
	inner http.Handler

	tokensIssued, tokensRefused    atomic.Int64
	challenged, badToken           atomic.Int64
	servedWithToken, servedNoToken atomic.Int64
	mu                             sync.Mutex
	servedByAgent                  map[string]int
}

// BearerCounts is what a BearerRegistry has seen.
type BearerCounts struct {
	// TokensIssued counts tokens the token endpoint issued; TokensRefused,
	// requests to it refused for a wrong or missing credential.
	TokensIssued, TokensRefused int64
	// Challenged counts registry requests answered 401 for bearing no
	// token; BadToken, those refused for a token that is forged, expired,
	// or does not cover the request.
	Challenged, BadToken int64
	// ServedWithToken counts registry requests served under a valid token;
	// ServedWithoutToken, those served without one (the API's version
	// check /v2/ included), counted where the request reaches the registry
	// proper: a test checks it is zero to show nothing bypassed the tokens.
	ServedWithToken, ServedWithoutToken int64
}

// StartBearer runs a BearerRegistry on 127.0.0.1 with a free port for the
// rest of the test; t.Cleanup stops it. Content is held in memory.
func StartBearer(t testing.TB, opts BearerOptions) *BearerRegistry {
	t.Helper()
	b, err := NewBearer(opts)
	if err != nil {
		t.Fatalf("registrytest: %v", err)
	}
	host, closeFn, err := serveHandler(context.Background(), "127.0.0.1:0", b)
	if err != nil {
		t.Fatalf("registrytest: %v", err)
	}
	b.Host = host
	t.Cleanup(func() { cleanupClose(t, closeFn) })
	return b
}

// NewBearer returns the handler of a BearerRegistry (Host left empty) for
// a caller that serves it itself. The account must be named.
func NewBearer(opts BearerOptions) (*BearerRegistry, error) {
	if opts.User == "" || opts.Password == "" {
		return nil, errors.New("a bearer registry needs a user and a password for its token endpoint")
	}
	if opts.TTL <= 0 {
		opts.TTL = time.Minute
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	b := &BearerRegistry{opts: opts, key: key, servedByAgent: map[string]int{}}
	b.inner = b.counted(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	return b, nil
}

// counted wraps the registry proper: it counts each request that reaches
// it by whether it bears a token that verifies (checked again here, apart
// from the gate in ServeHTTP, so a gap in the gate shows in
// ServedWithoutToken rather than passing unseen).
func (b *BearerRegistry) counted(inner http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if _, err := b.verify(raw); !found || err != nil {
			b.servedNoToken.Add(1)
		} else {
			b.servedWithToken.Add(1)
			b.mu.Lock()
			b.servedByAgent[r.UserAgent()]++
			b.mu.Unlock()
		}
		inner.ServeHTTP(w, r)
	})
}

// Counts returns the counters so far.
func (b *BearerRegistry) Counts() BearerCounts {
	return BearerCounts{
		TokensIssued: b.tokensIssued.Load(), TokensRefused: b.tokensRefused.Load(),
		Challenged: b.challenged.Load(), BadToken: b.badToken.Load(),
		ServedWithToken: b.servedWithToken.Load(), ServedWithoutToken: b.servedNoToken.Load(),
	}
}

// ServedTo counts registry requests served under a valid token to clients
// whose User-Agent contains agent ("docker/" for the Docker daemon,
// "mercator" for the control plane's resolver).
func (b *BearerRegistry) ServedTo(agent string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for ua, c := range b.servedByAgent {
		if strings.Contains(ua, agent) {
			n += c
		}
	}
	return n
}

// ServeHTTP serves the token endpoint at /token and the registry API
// behind it.
func (b *BearerRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/token" {
		b.serveToken(w, r)
		return
	}
	repo, action := requiredAccess(r)
	scope := ""
	if repo != "" {
		scope = "repository:" + repo + ":" + action
		if action == "push" {
			scope = "repository:" + repo + ":pull,push"
		}
	}
	raw, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !found {
		b.challenged.Add(1)
		b.challenge(w, r, scope, "")
		return
	}
	claims, err := b.verify(raw)
	if err == nil && repo != "" && !claims.allows(repo, action) {
		err = fmt.Errorf("the token does not allow %s on repository %s", action, repo)
	}
	if err != nil {
		b.badToken.Add(1)
		b.challenge(w, r, scope, err.Error())
		return
	}
	b.inner.ServeHTTP(w, r)
}

// requiredAccess is the repository and action a registry API request
// needs: /v2/NAME/{manifests,blobs,tags}/..., pull for reads and push for
// writes; the version check /v2/ and the catalog need no repository.
func requiredAccess(r *http.Request) (repo, action string) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/v2/")
	if !ok {
		return "", ""
	}
	for _, kind := range []string{"/manifests/", "/blobs/", "/tags/"} {
		if i := strings.LastIndex(rest, kind); i > 0 {
			repo = rest[:i]
			break
		}
	}
	if repo == "" {
		return "", ""
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return repo, "pull"
	}
	return repo, "push"
}

// challenge answers 401 with the Bearer challenge that tells a client
// where to get a token for scope; problem, when not empty, is why the
// token presented was refused (error="invalid_token").
func (b *BearerRegistry) challenge(w http.ResponseWriter, r *http.Request, scope, problem string) {
	c := fmt.Sprintf(`Bearer realm="http://%s/token",service=%q`, r.Host, BearerService)
	if scope != "" {
		c += fmt.Sprintf(",scope=%q", scope)
	}
	if problem != "" {
		c += `,error="invalid_token"`
	}
	w.Header().Set("WWW-Authenticate", c)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	msg := "authentication required"
	if problem != "" {
		msg = problem
	}
	body, _ := json.Marshal(map[string]any{"errors": []map[string]string{{"code": "UNAUTHORIZED", "message": msg}}})
	w.Write(body)
}

// serveToken is the token endpoint: GET with the Basic credential and
// ?service=&scope=..., or POST with grant_type=password, username,
// password, service and scope in a form body.
func (b *BearerRegistry) serveToken(w http.ResponseWriter, r *http.Request) {
	var user, password string
	var params url.Values
	switch r.Method {
	case http.MethodGet:
		user, password, _ = r.BasicAuth()
		params = r.URL.Query()
	case http.MethodPost:
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "token request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if r.PostForm.Get("grant_type") != "password" {
			// containerd asks for a refresh-token grant only when it holds
			// one; anything but a password grant is not offered here.
			http.Error(w, `unsupported grant_type: only "password" is offered`, http.StatusBadRequest)
			return
		}
		user, password, params = r.PostForm.Get("username"), r.PostForm.Get("password"), r.PostForm
	default:
		http.Error(w, "the token endpoint takes GET or POST", http.StatusMethodNotAllowed)
		return
	}
	if user != b.opts.User || !hmac.Equal([]byte(password), []byte(b.opts.Password)) {
		b.tokensRefused.Add(1)
		w.Header().Set("WWW-Authenticate", `Basic realm="mercator-test-registry token"`)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"errors":[{"code":"UNAUTHORIZED","message":"incorrect username or password"}]}`))
		return
	}
	if s := params.Get("service"); s != "" && s != BearerService {
		http.Error(w, fmt.Sprintf("service %q is not this registry's (%q)", s, BearerService), http.StatusBadRequest)
		return
	}
	now := b.opts.Now()
	claims := tokenClaims{Subject: user, Expires: now.Add(b.opts.TTL).Unix(), Access: grantedAccess(params["scope"])}
	token, err := b.sign(claims)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	b.tokensIssued.Add(1)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"token": token, "access_token": token,
		"expires_in": int(b.opts.TTL / time.Second), "issued_at": now.UTC().Format(time.RFC3339),
	})
}

// tokenClaims is what a token says: whose it is, until when (Unix
// seconds), and which actions on which repositories it allows.
type tokenClaims struct {
	Subject string              `json:"sub"`
	Expires int64               `json:"exp"`
	Access  map[string][]string `json:"access"`
}

func (c tokenClaims) allows(repo, action string) bool {
	return slices.Contains(c.Access[repo], action)
}

// grantedAccess is what the account is granted for the scopes asked
// ("repository:NAME:pull,push", possibly several): pull and push on any
// repository, nothing else (other resource types and actions are dropped,
// as a registry grants only what the account may do).
func grantedAccess(scopes []string) map[string][]string {
	out := map[string][]string{}
	for _, s := range scopes {
		for _, one := range strings.Fields(s) {
			parts := strings.Split(one, ":")
			if len(parts) < 3 || parts[0] != "repository" {
				continue
			}
			repo := strings.Join(parts[1:len(parts)-1], ":")
			for _, a := range strings.Split(parts[len(parts)-1], ",") {
				if (a == "pull" || a == "push") && !slices.Contains(out[repo], a) {
					out[repo] = append(out[repo], a)
				}
			}
		}
	}
	return out
}

// sign makes a token: base64url(JSON claims) "." base64url(HMAC-SHA256).
func (b *BearerRegistry) sign(c tokenClaims) (string, error) {
	body, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	p := base64.RawURLEncoding.EncodeToString(body)
	return p + "." + base64.RawURLEncoding.EncodeToString(b.mac(p)), nil
}

func (b *BearerRegistry) mac(payload string) []byte {
	m := hmac.New(sha256.New, b.key)
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// verify checks a token's signature and expiry and returns its claims.
func (b *BearerRegistry) verify(token string) (tokenClaims, error) {
	p, sig, ok := strings.Cut(token, ".")
	if !ok {
		return tokenClaims{}, errors.New("the token is malformed")
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, b.mac(p)) {
		return tokenClaims{}, errors.New("the token's signature is not this registry's")
	}
	body, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return tokenClaims{}, errors.New("the token is malformed")
	}
	var c tokenClaims
	if err := json.Unmarshal(body, &c); err != nil {
		return tokenClaims{}, errors.New("the token is malformed")
	}
	if !b.opts.Now().Before(time.Unix(c.Expires, 0)) {
		return tokenClaims{}, errors.New("the token has expired")
	}
	return c, nil
}
