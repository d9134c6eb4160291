package controlplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/controlplane/artifact"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/hashcopy"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

type artifactFixture struct {
	st      store.Store
	clock   *fakeClock
	dataDir string
	key     []byte
	srv     *Server
	http    *httptest.Server
	client  *client.Client
	token   string
	// wrap, when set, stands between the test server and the handler
	// (to break requests on purpose).
	wrap func(http.Handler) http.Handler
}

func newArtifactFixture(t *testing.T) *artifactFixture {
	f := &artifactFixture{st: memstore.New(), clock: &fakeClock{now: time.Now().UTC()}, dataDir: t.TempDir()}
	f.key = make([]byte, RegistryKeySize)
	rand.Read(f.key)
	f.token = "mca_" + httpapi.RandomToken()
	if err := f.st.Update(context.Background(), func(tx store.Tx) error {
		return tx.CreateToken(store.Token{Hash: httpapi.HashToken(f.token), Name: "admin", CreatedAt: f.clock.Now()})
	}); err != nil {
		t.Fatal(err)
	}
	f.start(t)
	return f
}

// start (re)starts the server over the same store and directories, as a
// restarted control plane would be.
func (f *artifactFixture) start(t *testing.T) {
	mux := http.NewServeMux()
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	cs, err := content.Open(t.Context(), content.Options{DataDir: f.dataDir, PublicURL: ts.URL, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	f.srv = New(Config{Now: f.clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Content: cs, UploadDir: f.dataDir + "/uploads", RegistryKey: f.key}, f.st, nil, nil)
	var h http.Handler = f.srv.Handler()
	if f.wrap != nil {
		h = f.wrap(h)
	}
	mux.Handle("/", h)
	f.http = ts
	f.client = client.New(ts.URL, f.token, nil)
}

func (f *artifactFixture) call(t *testing.T, method, path string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.http.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func digestHex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// crcHex is b's CRC-32C as a commit states it, computed apart from the
// api package's helpers.
func crcHex(b []byte) string {
	return fmt.Sprintf("%08x", crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

func TestUploadResumesAcrossRestartAndVerifies(t *testing.T) {
	f := newArtifactFixture(t)
	data := bytes.Repeat([]byte("0123456789"), 300_000)
	d := digestHex(data)
	var up api.Upload
	code, body := f.call(t, "POST", "/v1/artifacts/data/uploads", strings.NewReader(`{"size":3000000,"sha256":"`+d+`"}`))
	if code != http.StatusCreated || json.Unmarshal(body, &up) != nil {
		t.Fatalf("create upload: %d %s", code, body)
	}
	if code, body := f.call(t, "PUT", "/v1/uploads/"+up.ID+"?offset=0", bytes.NewReader(data[:1_000_000])); code != 200 {
		t.Fatalf("first part: %d %s", code, body)
	}
	// Sending from the wrong place is refused, naming where to resume.
	code, body = f.call(t, "PUT", "/v1/uploads/"+up.ID+"?offset=5", bytes.NewReader(data[5:10]))
	if code != http.StatusConflict || !strings.Contains(string(body), "send from offset 1000000") {
		t.Fatalf("wrong offset: %d %s", code, body)
	}
	// A restart: the upload resumes from what is on disk.
	f.start(t)
	got, err := f.client.GetUpload(context.Background(), up.ID)
	if err != nil || got.Received != 1_000_000 {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	v, err := f.client.PushArtifact(context.Background(), "data", client.BytesPayload(data, d, api.ArtifactFile), client.PushOptions{UploadID: up.ID})
	if err != nil || v.Version != "v1" || v.SHA256 != d || v.Size != int64(len(data)) {
		t.Fatalf("resumed push = %+v, %v", v, err)
	}
	// The same content again is the same version, sent nowhere.
	again, err := f.client.PushArtifact(context.Background(), "data", client.BytesPayload(data, d, api.ArtifactFile), client.PushOptions{})
	if err != nil || again != v {
		t.Fatalf("second push = %+v, %v; want %+v", again, err, v)
	}
	// The same content under another name needs no upload either.
	alias, err := f.client.PushArtifact(context.Background(), "alias", client.BytesPayload(data, d, api.ArtifactFile), client.PushOptions{})
	if err != nil || alias.Ref() != "alias@v1" || alias.SHA256 != d {
		t.Fatalf("alias = %+v, %v", alias, err)
	}
	other := []byte("other content")
	v2, err := f.client.PushArtifact(context.Background(), "data", client.BytesPayload(other, digestHex(other), api.ArtifactFile), client.PushOptions{})
	if err != nil || v2.Version != "v2" {
		t.Fatalf("other content = %+v, %v; want data@v2", v2, err)
	}
	latest, err := f.client.GetArtifact(context.Background(), "data", "")
	if err != nil || latest.Version != "v2" {
		t.Errorf("latest = %+v, %v", latest, err)
	}

	// A client whose digest disagrees with the bytes is refused, and the
	// upload discarded.
	lie := []byte("what the client claims")
	_, err = f.client.PushArtifact(context.Background(), "data", client.BytesPayload(lie, digestHex([]byte("something else")), api.ArtifactFile), client.PushOptions{})
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "hash to") {
		t.Errorf("mismatched digest: %v", err)
	}
	list, err := f.client.ListArtifacts(context.Background(), "data")
	if err != nil || len(list.Artifacts) != 2 {
		t.Errorf("versions of data = %+v, %v, want 2", list.Artifacts, err)
	}
	// More bytes than declared are refused.
	up = api.Upload{}
	_, body = f.call(t, "POST", "/v1/artifacts/x/uploads", strings.NewReader(`{"size":3}`))
	if err := json.Unmarshal(body, &up); err != nil {
		t.Fatalf("upload: %v: %s", err, body)
	}
	if code, body := f.call(t, "PUT", "/v1/uploads/"+up.ID+"?offset=0", strings.NewReader("four")); code != http.StatusBadRequest {
		t.Errorf("oversized body: %d %s", code, body)
	}
	for _, bad := range []string{"/v1/artifacts/a@b/uploads", "/v1/artifacts/-x/uploads"} {
		if code, _ := f.call(t, "POST", bad, strings.NewReader(`{"size":1}`)); code != http.StatusBadRequest && code != http.StatusNotFound {
			t.Errorf("POST %s = %d", bad, code)
		}
	}
}

func TestOutboundMintsReadsAndStoresNone(t *testing.T) {
	f := newArtifactFixture(t)
	data := []byte("content for a node")
	v, err := f.client.PushArtifact(context.Background(), "data", client.BytesPayload(data, digestHex(data), api.ArtifactFile), client.PushOptions{})
	if err != nil {
		t.Fatal(err)
	}
	prep := nodeproto.PrepareArtifactCommand{Name: "data", Version: v.Version, SHA256: v.SHA256, Size: v.Size, Format: v.Format}
	stored := nodeproto.Command{Kind: nodeproto.KindPrepareArtifact, PrepareArtifact: &prep}
	sent := f.srv.outbound(context.Background(), "", stored)
	if stored.PrepareArtifact.URL != "" {
		t.Fatal("outbound changed the stored command")
	}
	c := sent.PrepareArtifact
	if c.URL == "" || !c.ExpiresAt.After(f.clock.Now()) || c.ExpiresAt.After(f.clock.Now().Add(artifact.DefaultContentReadTTL+time.Second)) {
		t.Fatalf("minted read %q expiring %s", c.URL, c.ExpiresAt)
	}
	resp, err := http.Get(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !bytes.Equal(got, data) {
		t.Fatalf("GET minted read: %d %q %v", resp.StatusCode, got, err)
	}
	// The read expires with the server's clock.
	f.clock.Advance(artifact.DefaultContentReadTTL + time.Second)
	if resp, err = http.Get(c.URL); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("expired read = %d", resp.StatusCode)
	}
	// A launch's Artifacts are minted too.
	launch := nodeproto.Command{Kind: nodeproto.KindLaunchWorkload, LaunchWorkload: &nodeproto.LaunchWorkloadCommand{Image: "127.0.0.1:5/x@sha256:" + strings.Repeat("a", 64),
		Artifacts: []nodeproto.ArtifactMount{{PrepareArtifactCommand: prep, MountPath: "/d"}}}}
	out := f.srv.outbound(context.Background(), "", launch)
	if out.LaunchWorkload.Artifacts[0].URL == "" || launch.LaunchWorkload.Artifacts[0].URL != "" {
		t.Error("launch artifacts were not minted, or the stored launch was changed")
	}
}

func TestRegistryCredentialsAreSealedAndNeverReturned(t *testing.T) {
	f := newArtifactFixture(t)
	ctx := context.Background()
	const password = "hunter2-very-secret"
	r, err := f.client.AddRegistry(ctx, "Registry.Example:5000", "bot", password)
	if err != nil || r.Host != "registry.example:5000" || r.Username != "bot" {
		t.Fatalf("add = %+v, %v", r, err)
	}
	_, body := f.call(t, "GET", "/v1/registries", nil)
	if strings.Contains(string(body), password) || !strings.Contains(string(body), "registry.example:5000") {
		t.Fatalf("list: %s", body)
	}
	var stored store.RegistryCredential
	err = f.st.View(ctx, func(tx store.Tx) error {
		stored, err = tx.GetRegistryCredential("", "registry.example:5000")
		return err
	})
	if err != nil || bytes.Contains(stored.Sealed, []byte(password)) || len(stored.Sealed) == 0 {
		t.Fatalf("stored credential: %+v, %v", stored, err)
	}
	// Sent with the launch that needs it, and only then.
	image := "registry.example:5000/team/app@sha256:" + strings.Repeat("b", 64)
	storeRun(t, f.st, "r-pull", "")
	launch := nodeproto.Command{Kind: nodeproto.KindLaunchWorkload, LaunchWorkload: &nodeproto.LaunchWorkloadCommand{
		WorkloadKey: nodeproto.WorkloadKey{RunID: "r-pull", Attempt: 1}, Image: image}}
	out := f.srv.outbound(ctx, "", launch)
	raw, err := base64.URLEncoding.DecodeString(out.LaunchWorkload.RegistryAuth)
	var auth map[string]string
	if err != nil || json.Unmarshal(raw, &auth) != nil || auth["username"] != "bot" || auth["password"] != password || auth["serveraddress"] != "registry.example:5000" {
		t.Fatalf("registry auth = %q (%v)", raw, err)
	}
	if launch.LaunchWorkload.RegistryAuth != "" {
		t.Error("outbound wrote the credential into the stored command")
	}
	other := nodeproto.Command{Kind: nodeproto.KindLaunchWorkload, LaunchWorkload: &nodeproto.LaunchWorkloadCommand{
		WorkloadKey: nodeproto.WorkloadKey{RunID: "r-pull", Attempt: 1}, Image: "ghcr.io/x/y@sha256:" + strings.Repeat("c", 64)}}
	if a := f.srv.outbound(ctx, "", other).LaunchWorkload.RegistryAuth; a != "" {
		t.Errorf("a launch from another registry got a credential: %q", a)
	}
	if u, p, ok := f.srv.RegistryCredentials(ctx, "registry.example:5000"); !ok || u != "bot" || p != password {
		t.Errorf("resolver credentials = %q %q %v", u, p, ok)
	}
	// Another key opens nothing (and says so in the log, not in a pull).
	f.key = make([]byte, RegistryKeySize)
	f.start(t)
	if _, _, ok := f.srv.RegistryCredentials(ctx, "registry.example:5000"); ok {
		t.Error("a credential sealed under one key opened under another")
	}
	// Removed, it is gone.
	if _, err := f.client.RemoveRegistry(ctx, "registry.example:5000"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.RemoveRegistry(ctx, "registry.example:5000"); !errors.Is(err, failure.ErrNotFound) {
		t.Errorf("second remove = %v", err)
	}
	for _, bad := range []string{"https://ghcr.io", "ghcr.io/org", ""} {
		if _, err := f.client.AddRegistry(ctx, bad, "u", "p"); !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("host %q: %v", bad, err)
		}
	}
}

// putCounter counts the content bytes the server is sent (PUT bodies).
type putCounter struct{ bytes atomic.Int64 }

func (c *putCounter) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			r.Body = &countingBody{ReadCloser: r.Body, n: &c.bytes}
		}
		next.ServeHTTP(w, r)
	})
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// streamed is a payload whose digest the client computes as it sends.
func streamed(data []byte) client.Payload { return client.BytesPayload(data, "", api.ArtifactFile) }

// TestStreamedPushIsVerifiedAtTheCommit: a push that hashes as it sends
// states its digest at the commit; the same content pushed again is the
// same version and sends nothing (the name has a version of its size, so
// the client hashes first and asks); other content of the same size is a
// new version; content stored under another name is shared.
func TestStreamedPushIsVerifiedAtTheCommit(t *testing.T) {
	f := newArtifactFixture(t)
	var sent putCounter
	f.wrap = sent.wrap
	f.start(t)
	ctx := context.Background()
	data := bytes.Repeat([]byte("streamed "), 500_000)
	v, err := f.client.PushArtifact(ctx, "data", streamed(data), client.PushOptions{})
	if err != nil || v.Ref() != "data@v1" || v.SHA256 != digestHex(data) || v.Size != int64(len(data)) {
		t.Fatalf("push = %+v, %v", v, err)
	}
	if got := sent.bytes.Load(); got != int64(len(data)) {
		t.Errorf("sent %d bytes, want %d: the content once", got, len(data))
	}

	sent.bytes.Store(0)
	started := false
	again, err := f.client.PushArtifact(ctx, "data", streamed(data), client.PushOptions{Started: func(string) { started = true }})
	if err != nil || again != v {
		t.Fatalf("the same content again = %+v, %v; want %+v", again, err, v)
	}
	if started || sent.bytes.Load() != 0 {
		t.Errorf("the same content again started an upload (%v) or sent %d bytes", started, sent.bytes.Load())
	}

	sameSize := bytes.Clone(data)
	sameSize[len(sameSize)-1] ^= 1
	v2, err := f.client.PushArtifact(ctx, "data", streamed(sameSize), client.PushOptions{})
	if err != nil || v2.Ref() != "data@v2" || v2.SHA256 != digestHex(sameSize) {
		t.Fatalf("other content of the same size = %+v, %v", v2, err)
	}

	// Content the store holds under "data", streamed under a new name: it
	// is sent (nothing says to ask) and the stored object is shared.
	alias, err := f.client.PushArtifact(ctx, "alias", streamed(data), client.PushOptions{})
	if err != nil || alias.Ref() != "alias@v1" || alias.SHA256 != v.SHA256 {
		t.Fatalf("alias = %+v, %v", alias, err)
	}
	list, err := f.client.ListArtifacts(ctx, "data")
	if err != nil || len(list.Artifacts) != 2 {
		t.Errorf("versions of data = %+v, %v, want 2", list.Artifacts, err)
	}

	// Empty content is content too.
	if e, err := f.client.PushArtifact(ctx, "empty", streamed(nil), client.PushOptions{}); err != nil || e.SHA256 != digestHex(nil) {
		t.Errorf("empty = %+v, %v", e, err)
	}
}

// TestCommitRefusesAMismatchedClientDigest: on the wire, an upload started
// without a digest is committed only with the client's check; a commit
// without one is refused and the upload kept; a CRC-32C or a SHA-256 that
// is not the server's own is refused, the upload discarded and nothing
// created; a matching CRC-32C, or SHA-256 (an older client's commit), adds
// the version.
func TestCommitRefusesAMismatchedClientDigest(t *testing.T) {
	f := newArtifactFixture(t)
	ctx := context.Background()
	data := []byte("the bytes the server receives")
	begin := func(body string) api.Upload {
		t.Helper()
		var up api.Upload
		code, got := f.call(t, "POST", "/v1/artifacts/data/uploads", strings.NewReader(body))
		if code != http.StatusCreated || json.Unmarshal(got, &up) != nil {
			t.Fatalf("create upload: %d %s", code, got)
		}
		if code, got := f.call(t, "PUT", "/v1/uploads/"+up.ID+"?offset=0", bytes.NewReader(data)); code != 200 {
			t.Fatalf("put: %d %s", code, got)
		}
		return up
	}
	noVersion := func(when string) {
		t.Helper()
		if _, err := f.client.GetArtifact(ctx, "data", ""); !errors.Is(err, failure.ErrNotFound) {
			t.Errorf("data after %s: %v, want no version", when, err)
		}
		if _, err := f.srv.cfg.Content.Stat(ctx, digestHex(data)); !errors.Is(err, failure.ErrNotFound) {
			t.Errorf("content after %s: %v, want none stored", when, err)
		}
	}
	refusedAndDiscarded := func(up api.Upload, body, want string) {
		t.Helper()
		code, got := f.call(t, "POST", "/v1/uploads/"+up.ID+"/commit", strings.NewReader(body))
		if code != http.StatusBadRequest || !strings.Contains(string(got), want) {
			t.Fatalf("commit %s: %d %s; want 400 saying %q", body, code, got, want)
		}
		if _, err := f.client.GetUpload(ctx, up.ID); !errors.Is(err, failure.ErrNotFound) {
			t.Errorf("the upload refused with %s: %v, want discarded", body, err)
		}
		noVersion("the commit " + body)
	}

	up := begin(fmt.Sprintf(`{"size":%d}`, len(data)))
	if up.SHA256 != "" {
		t.Fatalf("an upload begun without a digest shows %q", up.SHA256)
	}
	for body, want := range map[string]string{
		"":                      "must state its check",
		`{}`:                    "must state its check",
		`{"sha256":"abc"}`:      "not a SHA-256 digest",
		`{"crc32c":"abc"}`:      "not a CRC-32C",
		`{"crc32c":"ABCDEF01"}`: "not a CRC-32C",
	} {
		var r io.Reader
		if body != "" {
			r = strings.NewReader(body)
		}
		if code, got := f.call(t, "POST", "/v1/uploads/"+up.ID+"/commit", r); code != http.StatusBadRequest || !strings.Contains(string(got), want) {
			t.Fatalf("commit %q: %d %s; want 400 saying %q", body, code, got, want)
		}
	}
	if got, err := f.client.GetUpload(ctx, up.ID); err != nil || got.Received != int64(len(data)) {
		t.Fatalf("after refused commits the upload is %+v, %v; want it kept", got, err)
	}
	wrong := digestHex([]byte("what the client thinks it sent"))
	refusedAndDiscarded(up, `{"sha256":"`+wrong+`"}`, "hash to "+digestHex(data)+", not "+wrong)

	wrongCRC := crcHex([]byte("what the client thinks it sent"))
	refusedAndDiscarded(begin(fmt.Sprintf(`{"size":%d}`, len(data))), `{"crc32c":"`+wrongCRC+`"}`,
		"have the CRC-32C "+crcHex(data)+", not "+wrongCRC)
	// Every check stated must match: a right SHA-256 does not excuse a
	// wrong CRC-32C.
	refusedAndDiscarded(begin(fmt.Sprintf(`{"size":%d}`, len(data))), `{"sha256":"`+digestHex(data)+`","crc32c":"`+wrongCRC+`"}`, "CRC-32C")
	// The digest stated at the start and at the commit must both match.
	refusedAndDiscarded(begin(fmt.Sprintf(`{"size":%d,"sha256":"%s"}`, len(data), digestHex(data))), `{"sha256":"`+wrong+`"}`, "not "+wrong)
	refusedAndDiscarded(begin(fmt.Sprintf(`{"size":%d,"sha256":"%s"}`, len(data), wrong)), `{"crc32c":"`+crcHex(data)+`"}`, "not "+wrong)

	// A matching CRC-32C adds the version, known by the server's SHA-256.
	code, got := f.call(t, "POST", "/v1/uploads/"+begin(fmt.Sprintf(`{"size":%d}`, len(data))).ID+"/commit", strings.NewReader(`{"crc32c":"`+crcHex(data)+`"}`))
	var v api.ArtifactVersion
	if code != http.StatusCreated || json.Unmarshal(got, &v) != nil || v.Ref() != "data@v1" || v.SHA256 != digestHex(data) {
		t.Fatalf("commit with the right CRC-32C: %d %s", code, got)
	}
	// So does a SHA-256 at the commit, as clients before the CRC-32C send.
	code, got = f.call(t, "POST", "/v1/uploads/"+begin(fmt.Sprintf(`{"size":%d}`, len(data))).ID+"/commit", strings.NewReader(`{"sha256":"`+digestHex(data)+`"}`))
	if code != http.StatusOK || json.Unmarshal(got, &v) != nil || v.Ref() != "data@v1" {
		t.Fatalf("commit with the right SHA-256 (the same content again): %d %s", code, got)
	}
	other := []byte("other bytes, an older client")
	var up2 api.Upload
	_, got = f.call(t, "POST", "/v1/artifacts/data/uploads", strings.NewReader(fmt.Sprintf(`{"size":%d}`, len(other))))
	if err := json.Unmarshal(got, &up2); err != nil {
		t.Fatalf("upload: %v: %s", err, got)
	}
	f.call(t, "PUT", "/v1/uploads/"+up2.ID+"?offset=0", bytes.NewReader(other))
	code, got = f.call(t, "POST", "/v1/uploads/"+up2.ID+"/commit", strings.NewReader(`{"sha256":"`+digestHex(other)+`"}`))
	if code != http.StatusCreated || json.Unmarshal(got, &v) != nil || v.Ref() != "data@v2" || v.SHA256 != digestHex(other) {
		t.Fatalf("an older client's commit with its SHA-256: %d %s", code, got)
	}
}

// cutFirstPut breaks the first PUT after n bytes of its body, as a dropped
// connection would, and counts the PUTs.
func cutFirstPut(n int64, puts *atomic.Int32) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut && puts.Add(1) == 1 {
				r.Body = io.NopCloser(io.MultiReader(io.LimitReader(r.Body, n), iotest.ErrReader(errors.New("connection reset"))))
			}
			next.ServeHTTP(w, r)
		})
	}
}

// TestStreamedPushResumes: a push that checks as it sends (CRC-32C)
// resumes after a send broken midway (its check goes back to what the
// server holds), and in a later process from an upload another push began
// (it rereads what was sent before), across a restart of the control plane
// (which rebuilds its digests from disk); a resumed upload whose first
// part is not this content is refused at the commit and creates nothing.
func TestStreamedPushResumes(t *testing.T) {
	f := newArtifactFixture(t)
	ctx := context.Background()
	data := make([]byte, 5<<20)
	rand.Read(data)
	var puts atomic.Int32
	f.wrap = cutFirstPut(2<<20+12345, &puts)
	f.start(t)
	v, err := f.client.PushArtifact(ctx, "data", streamed(data), client.PushOptions{})
	if err != nil || v.Ref() != "data@v1" || v.SHA256 != digestHex(data) {
		t.Fatalf("push across a broken send = %+v, %v", v, err)
	}
	if puts.Load() != 2 {
		t.Errorf("%d PUTs; want the broken one and its resumption", puts.Load())
	}

	// An upload begun by another process, without a digest: resumed.
	begin := func(name string, content []byte) string {
		var up api.Upload
		_, body := f.call(t, "POST", "/v1/artifacts/"+name+"/uploads", strings.NewReader(fmt.Sprintf(`{"size":%d}`, len(content))))
		if json.Unmarshal(body, &up) != nil || up.ID == "" {
			t.Fatalf("create upload: %s", body)
		}
		if code, body := f.call(t, "PUT", "/v1/uploads/"+up.ID+"?offset=0", bytes.NewReader(content[:1<<20])); code != 200 {
			t.Fatalf("first part: %d %s", code, body)
		}
		return up.ID
	}
	other := make([]byte, 3<<20)
	rand.Read(other)
	id := begin("other", other)
	f.start(t)
	v, err = f.client.PushArtifact(ctx, "other", streamed(other), client.PushOptions{UploadID: id})
	if err != nil || v.Ref() != "other@v1" || v.SHA256 != digestHex(other) {
		t.Fatalf("resumed push = %+v, %v", v, err)
	}
	if _, err := f.client.GetUpload(ctx, id); !errors.Is(err, failure.ErrNotFound) {
		t.Errorf("the resumed upload is still there (%v): the push started another", err)
	}

	// The first part came from a file that has changed since: the commit
	// is refused and nothing is made.
	third := make([]byte, 4<<20)
	rand.Read(third)
	before := bytes.Clone(third)
	before[100] ^= 1
	_, err = f.client.PushArtifact(ctx, "third", streamed(third), client.PushOptions{UploadID: begin("third", before)})
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "have the CRC-32C "+crcHex(append(before[:1<<20:1<<20], third[1<<20:]...))+", not "+crcHex(third)) {
		t.Fatalf("resuming an upload of other bytes: %v, want the commit refused", err)
	}
	if _, err := f.client.GetArtifact(ctx, "third", ""); !errors.Is(err, failure.ErrNotFound) {
		t.Errorf("third after a refused commit: %v, want no version", err)
	}
}

// filePut records, for each PUT, the length it stated, and counts the
// bytes the server read.
type filePut struct {
	putCounter
	mu      sync.Mutex
	lengths []int64
}

func (c *filePut) wrap(next http.Handler) http.Handler {
	return c.putCounter.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			c.mu.Lock()
			c.lengths = append(c.lengths, r.ContentLength)
			c.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	}))
}

// TestFilePushSendsTheFile: a file pushed over plain HTTP goes as the file
// itself (one PUT stating its length, which is how the transport comes to
// use sendfile), checked by a read alongside: the version is the file's,
// its bytes are sent once, and progress ends at the whole. A send broken
// midway resumes (the check, which may have read ahead of the send, goes
// back to what the server holds); a file changed between a broken send
// and its resumption is refused, and nothing is made.
func TestFilePushSendsTheFile(t *testing.T) {
	f := newArtifactFixture(t)
	var puts filePut
	f.wrap = puts.wrap
	f.start(t)
	ctx := context.Background()
	dir := t.TempDir()
	writeFile := func(name string, size int) (string, []byte) {
		data := make([]byte, size)
		rand.Read(data)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p, data
	}
	payload := func(p string) client.Payload {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return client.FilePayload(p, fi)
	}

	p, data := writeFile("a.bin", 3*hashcopy.PieceSize+17)
	var last, total int64
	v, err := f.client.PushArtifact(ctx, "file", payload(p), client.PushOptions{Progress: func(sent, all int64) { last, total = sent, all }})
	if err != nil || v.Ref() != "file@v1" || v.SHA256 != digestHex(data) || v.Size != int64(len(data)) {
		t.Fatalf("push = %+v, %v", v, err)
	}
	if got := puts.bytes.Load(); got != int64(len(data)) {
		t.Errorf("sent %d bytes, want %d: the file once", got, len(data))
	}
	if len(puts.lengths) != 1 || puts.lengths[0] != int64(len(data)) {
		t.Errorf("PUTs stated lengths %v, want one of %d (the file as the body)", puts.lengths, len(data))
	}
	if last != int64(len(data)) || total != int64(len(data)) {
		t.Errorf("progress ended at %d of %d, want %d of %d", last, total, len(data), len(data))
	}

	// A send broken midway, then resumed from where the server stands.
	var cuts atomic.Int32
	f.wrap = func(next http.Handler) http.Handler { return cutFirstPut(5<<20+321, &cuts)(puts.wrap(next)) }
	f.start(t)
	p2, data2 := writeFile("b.bin", 9<<20)
	v, err = f.client.PushArtifact(ctx, "file", payload(p2), client.PushOptions{})
	if err != nil || v.Ref() != "file@v2" || v.SHA256 != digestHex(data2) {
		t.Fatalf("push across a broken send = %+v, %v", v, err)
	}
	if cuts.Load() != 2 {
		t.Errorf("%d PUTs; want the broken one and its resumption", cuts.Load())
	}

	// Changed (grown) after the first send broke: refused when resumed.
	cuts.Store(0)
	p3, _ := writeFile("c.bin", 9<<20) // its bytes change below
	f.wrap = func(next http.Handler) http.Handler {
		cut := cutFirstPut(2<<20, &cuts)(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cut.ServeHTTP(w, r)
			if r.Method == http.MethodPut && cuts.Load() == 1 {
				fh, err := os.OpenFile(p3, os.O_APPEND|os.O_WRONLY, 0)
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := fh.Write([]byte("more")); err != nil {
					t.Error(err)
				}
				fh.Close()
			}
		})
	}
	f.start(t)
	_, err = f.client.PushArtifact(ctx, "changed", payload(p3), client.PushOptions{})
	if err == nil || !strings.Contains(err.Error(), "changed while it was pushed") {
		t.Fatalf("pushing a file changed between sends: %v, want it refused as changed", err)
	}
	if _, err := f.client.GetArtifact(ctx, "changed", ""); !errors.Is(err, failure.ErrNotFound) {
		t.Errorf("changed after a refused push: %v, want no version", err)
	}
}
