package registrytest

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct{ unix atomic.Int64 }

func (c *fakeClock) now() time.Time { return time.Unix(c.unix.Load(), 0) }

func startBearerTest(t *testing.T) (*BearerRegistry, *fakeClock) {
	clock := &fakeClock{}
	clock.unix.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix())
	return StartBearer(t, BearerOptions{User: "robot", Password: "s3cret", TTL: 30 * time.Second, Now: clock.now}), clock
}

// fetchToken asks the token endpoint with GET and Basic auth.
func fetchToken(t *testing.T, b *BearerRegistry, user, password, scope string) (string, int) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+b.Host+"/token?service="+BearerService+"&scope="+url.QueryEscape(scope), nil)
	req.SetBasicAuth(user, password)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Token string `json:"token"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	return body.Token, resp.StatusCode
}

// get sends a registry request with a bearer token (none when empty) and
// returns the status and the challenge.
func get(t *testing.T, b *BearerRegistry, method, path, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+b.Host+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}

func TestBearerRegistryPushAndPullThroughTokens(t *testing.T) {
	b, _ := startBearerTest(t)
	img, err := random.Image(256, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(b.Host+"/team/app:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	auth := remote.WithAuth(&authn.Basic{Username: "robot", Password: "s3cret"})
	if err := remote.Write(ref, img, auth); err != nil {
		t.Fatalf("push through the bearer flow: %v", err)
	}
	got, err := remote.Image(ref, auth)
	if err != nil {
		t.Fatalf("pull through the bearer flow: %v", err)
	}
	want, _ := img.Digest()
	if d, _ := got.Digest(); d != want {
		t.Errorf("pulled %s, want %s", d, want)
	}
	c := b.Counts()
	if c.TokensIssued == 0 || c.Challenged == 0 || c.ServedWithToken == 0 {
		t.Errorf("counts %+v: want tokens issued, challenges and requests served with a token", c)
	}
	if c.ServedWithoutToken != 0 || c.TokensRefused != 0 {
		t.Errorf("counts %+v: want nothing served without a token and no refusal", c)
	}
	if b.ServedTo("go-containerregistry") == 0 {
		t.Errorf("no request served to go-containerregistry's user agent")
	}

	// A wrong password: the token endpoint refuses, and so the pull fails
	// with 401.
	_, err = remote.Image(ref, remote.WithAuth(&authn.Basic{Username: "robot", Password: "wrong"}))
	var terr *transport.Error
	if !errors.As(err, &terr) || terr.StatusCode != http.StatusUnauthorized {
		t.Errorf("pull with a wrong password: %v, want a 401 transport error", err)
	}
	if b.Counts().TokensRefused == 0 {
		t.Errorf("the wrong password was not counted as refused")
	}
}

func TestBearerRegistryChallengeNamesRealmServiceAndScope(t *testing.T) {
	b, _ := startBearerTest(t)
	code, challenge := get(t, b, http.MethodGet, "/v2/team/app/manifests/1", "")
	want := `Bearer realm="http://` + b.Host + `/token",service="` + BearerService + `",scope="repository:team/app:pull"`
	if code != http.StatusUnauthorized || challenge != want {
		t.Errorf("GET without a token = %d %q, want 401 %q", code, challenge, want)
	}
	if _, challenge = get(t, b, http.MethodPut, "/v2/team/app/manifests/1", ""); !strings.Contains(challenge, `scope="repository:team/app:pull,push"`) {
		t.Errorf("PUT challenge %q does not ask for push", challenge)
	}
	if code, _ = get(t, b, http.MethodGet, "/v2/", ""); code != http.StatusUnauthorized {
		t.Errorf("the version check without a token = %d, want 401", code)
	}
	if c := b.Counts(); c.Challenged != 3 || c.ServedWithoutToken != 0 {
		t.Errorf("counts %+v, want 3 challenged and nothing served", c)
	}
}

func TestBearerRegistryRefusesExpiredForgedAndOutOfScopeTokens(t *testing.T) {
	b, clock := startBearerTest(t)
	if _, code := fetchToken(t, b, "robot", "wrong", "repository:team/app:pull"); code != http.StatusUnauthorized {
		t.Errorf("token with a wrong password = %d, want 401", code)
	}
	token, code := fetchToken(t, b, "robot", "s3cret", "repository:team/app:pull")
	if code != http.StatusOK || token == "" {
		t.Fatalf("token = %d %q", code, token)
	}
	// Valid and in scope: served (404: the repository is empty).
	if code, _ := get(t, b, http.MethodGet, "/v2/team/app/manifests/1", token); code != http.StatusNotFound {
		t.Errorf("GET with a valid token = %d, want 404 from the registry proper", code)
	}
	for _, c := range []struct{ what, method, path, token string }{
		{"another repository", http.MethodGet, "/v2/team/other/manifests/1", token},
		{"a push with a pull token", http.MethodPut, "/v2/team/app/manifests/1", token},
		{"a forged signature", http.MethodGet, "/v2/team/app/manifests/1", token[:strings.Index(token, ".")] + ".AAAA"},
		{"a malformed token", http.MethodGet, "/v2/team/app/manifests/1", "not-a-token"},
	} {
		if code, challenge := get(t, b, c.method, c.path, c.token); code != http.StatusUnauthorized || !strings.Contains(challenge, `error="invalid_token"`) {
			t.Errorf("%s = %d %q, want 401 invalid_token", c.what, code, challenge)
		}
	}
	clock.unix.Add(29)
	if code, _ := get(t, b, http.MethodGet, "/v2/team/app/manifests/1", token); code != http.StatusNotFound {
		t.Errorf("GET a second before expiry = %d, want 404", code)
	}
	clock.unix.Add(1)
	if code, _ := get(t, b, http.MethodGet, "/v2/team/app/manifests/1", token); code != http.StatusUnauthorized {
		t.Errorf("GET with an expired token = %d, want 401", code)
	}
	if c := b.Counts(); c.BadToken != 5 || c.ServedWithToken != 2 || c.ServedWithoutToken != 0 || c.TokensIssued != 1 || c.TokensRefused != 1 {
		t.Errorf("counts %+v", c)
	}
}

func TestBearerRegistryPasswordGrant(t *testing.T) {
	b, _ := startBearerTest(t)
	form := url.Values{"grant_type": {"password"}, "username": {"robot"}, "password": {"s3cret"}, "service": {BearerService}, "scope": {"repository:team/app:pull"}, "client_id": {"containerd"}}
	resp, err := http.PostForm("http://"+b.Host+"/token", form)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		AccessToken string `json:"access_token"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || body.AccessToken == "" {
		t.Fatalf("password grant = %s, token %q", resp.Status, body.AccessToken)
	}
	if code, _ := get(t, b, http.MethodGet, "/v2/team/app/manifests/1", body.AccessToken); code != http.StatusNotFound {
		t.Errorf("GET with the granted token = %d, want 404", code)
	}
	form.Set("password", "wrong")
	resp, err = http.PostForm("http://"+b.Host+"/token", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("password grant with a wrong password = %s, want 401", resp.Status)
	}
}
