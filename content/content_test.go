package content

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/minio/minio-go/v7"

	"github.com/mercator/mercator/failure"
)

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// stage writes data to a file a Put may consume.
func stage(t testing.TB, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "upload")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func fetch(t *testing.T, u string, header http.Header) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// conformance is what every Store must do, checked through the interface.
func conformance(t *testing.T, s Store) {
	ctx := context.Background()
	data := []byte(strings.Repeat("mercator content ", 1000))
	d := digestOf(data)
	if _, err := s.Stat(ctx, d); !errors.Is(err, failure.ErrNotFound) {
		t.Fatalf("Stat of missing content = %v, want ErrNotFound", err)
	}
	if err := s.Put(ctx, d, stage(t, data), int64(len(data))); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if size, err := s.Stat(ctx, d); err != nil || size != int64(len(data)) {
		t.Fatalf("Stat = %d, %v; want %d", size, err, len(data))
	}
	// Idempotent: the same content again changes nothing.
	if err := s.Put(ctx, d, stage(t, data), int64(len(data))); err != nil {
		t.Fatalf("second Put: %v", err)
	}
	u, exp, err := s.ReadURL(ctx, d, time.Minute)
	if err != nil {
		t.Fatalf("ReadURL: %v", err)
	}
	if !exp.After(time.Now()) || exp.After(time.Now().Add(2*time.Minute)) {
		t.Errorf("expiry %s is not about a minute away", exp)
	}
	code, got := fetch(t, u, nil)
	if code != http.StatusOK || string(got) != string(data) {
		t.Fatalf("GET minted read: %d, %d bytes; want 200 with the content", code, len(got))
	}
	if _, _, err := s.ReadURL(ctx, "not-a-digest", time.Minute); !errors.Is(err, failure.ErrInvalid) {
		t.Errorf("ReadURL of a malformed digest = %v, want ErrInvalid", err)
	}
	if err := s.Put(ctx, "ABC", stage(t, data), 3); !errors.Is(err, failure.ErrInvalid) {
		t.Errorf("Put of a malformed digest = %v, want ErrInvalid", err)
	}
	if strings.Contains(s.Describe(), "secret") {
		t.Errorf("Describe leaks a secret: %s", s.Describe())
	}
}

func startLocal(t *testing.T, now func() time.Time) (*Local, *httptest.Server) {
	t.Helper()
	dir := t.TempDir()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	l, err := OpenLocal(filepath.Join(dir, "content"), filepath.Join(dir, "content-key"), srv.URL, now)
	if err != nil {
		t.Fatal(err)
	}
	mux.HandleFunc("GET "+ReadPath+"{digest}", l.ServeRead)
	return l, srv
}

func TestLocalConformance(t *testing.T) {
	l, _ := startLocal(t, nil)
	conformance(t, l)
}

func TestLocalKeyFile(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "content-key")
	a, err := OpenLocal(filepath.Join(dir, "c"), keyFile, "http://cp", nil)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(keyFile)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode = %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	b, err := OpenLocal(filepath.Join(dir, "c"), keyFile, "http://cp", nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(a.key) != string(b.key) {
		t.Error("a second start generated a new key instead of reading the stored one")
	}
	if err := os.Chmod(keyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenLocal(filepath.Join(dir, "c"), keyFile, "http://cp", nil); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a key readable by others was accepted (err %v)", err)
	}
}

func TestLocalRefusesWhatItDidNotMint(t *testing.T) {
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	l, srv := startLocal(t, clock)
	ctx := context.Background()
	data := []byte("exact bytes")
	other := []byte("other bytes")
	d, od := digestOf(data), digestOf(other)
	for _, c := range [][]byte{data, other} {
		if err := l.Put(ctx, digestOf(c), stage(t, c), int64(len(c))); err != nil {
			t.Fatal(err)
		}
	}
	u, _, err := l.ReadURL(ctx, d, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	parsed, _ := url.Parse(u)
	q := parsed.Query()

	// A range of the minted read is served (resuming a fetch).
	if code, got := fetch(t, u, http.Header{"Range": {"bytes=6-"}}); code != http.StatusPartialContent || string(got) != "bytes" {
		t.Errorf("ranged read = %d %q, want 206 \"bytes\"", code, got)
	}
	cases := map[string]string{
		"no signature":           srv.URL + ReadPath + d,
		"another object":         srv.URL + ReadPath + od + "?" + q.Encode(),
		"a later expiry":         srv.URL + ReadPath + d + "?expires=" + "99999999999" + "&sig=" + q.Get("sig"),
		"a tampered signature":   srv.URL + ReadPath + d + "?expires=" + q.Get("expires") + "&sig=AAAA" + q.Get("sig")[4:],
		"a signature of nothing": srv.URL + ReadPath + d + "?expires=" + q.Get("expires") + "&sig=",
	}
	for what, u := range cases {
		if code, body := fetch(t, u, nil); code != http.StatusUnauthorized || !strings.Contains(string(body), `"unauthorized"`) {
			t.Errorf("%s: %d %s, want 401 in the API's error shape", what, code, body)
		}
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	code, body := fetch(t, u, nil)
	if code != http.StatusUnauthorized || !strings.Contains(string(body), "expired") {
		t.Errorf("expired read: %d %s, want 401 saying it expired", code, body)
	}
}

// TestS3Conformance runs the suite against a real S3 protocol server
// (gofakes3, in process, on loopback), through the minio client. gofakes3
// does not verify signatures, so what this proves is the protocol (keys,
// path-style addressing, presigned URL shape and expiry parameter), not
// that a real S3 accepts the signature: that rests on the minio client's
// own SigV4 implementation.
func TestS3Conformance(t *testing.T) {
	s := startFakeS3(t)
	conformance(t, s)
	// Content lands under PREFIX/sha256/DIGEST.
	data := []byte(strings.Repeat("mercator content ", 1000))
	objs := s.client.ListObjects(context.Background(), s.cfg.Bucket, minio.ListObjectsOptions{Recursive: true})
	var keys []string
	for o := range objs {
		keys = append(keys, o.Key)
	}
	if len(keys) != 1 || keys[0] != "fleet/sha256/"+digestOf(data) {
		t.Errorf("objects = %q, want one under fleet/sha256/", keys)
	}
}

func startFakeS3(t *testing.T) *S3 {
	t.Helper()
	backend := s3mem.New()
	faker := gofakes3.New(backend, gofakes3.WithLogger(gofakes3.DiscardLog()))
	srv := httptest.NewServer(faker.Server())
	t.Cleanup(srv.Close)
	s, err := NewS3(S3Config{
		Endpoint: strings.TrimPrefix(srv.URL, "http://"), Bucket: "artifacts", Prefix: "fleet",
		Region: "us-east-1", Insecure: true, AccessKey: "AKIDTEST", SecretKey: "secret-key-of-the-control-plane",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.client.MakeBucket(context.Background(), "artifacts", minio.MakeBucketOptions{Region: "us-east-1"}); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestS3ReadURLCarriesNoKey: the presigned URL names the access key ID (as
// SigV4 does) and never the secret.
func TestS3ReadURLCarriesNoKey(t *testing.T) {
	s := startFakeS3(t)
	u, _, err := s.ReadURL(context.Background(), digestOf([]byte("x")), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(u, "secret-key-of-the-control-plane") {
		t.Fatalf("presigned URL contains the secret key: %s", u)
	}
	parsed, _ := url.Parse(u)
	if parsed.Query().Get("X-Amz-Signature") == "" || parsed.Query().Get("X-Amz-Expires") != "60" {
		t.Errorf("presigned URL lacks a signature or a 60s expiry: %s", u)
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(t.Context(), Options{DataDir: dir, PublicURL: "http://cp"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*Local); !ok {
		t.Errorf("default store is %T, want *Local", s)
	}
	env := map[string]string{"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "sk"}
	s, err = Open(t.Context(), Options{Spec: "s3://bucket/some/prefix?endpoint=127.0.0.1:9000&insecure=true", Env: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatal(err)
	}
	s3 := s.(*S3)
	if s3.cfg.Bucket != "bucket" || s3.cfg.Prefix != "some/prefix" || !s3.cfg.Insecure || s3.cfg.Endpoint != "127.0.0.1:9000" {
		t.Errorf("parsed %+v", s3.cfg)
	}
	if _, err := Open(t.Context(), Options{Spec: "s3://bucket?endpoint=x", Env: func(string) string { return "" }}); !errors.Is(err, failure.ErrInvalid) {
		t.Errorf("S3 without credentials = %v, want ErrInvalid", err)
	}
	if _, err := Open(t.Context(), Options{Spec: "ftp://x"}); !errors.Is(err, failure.ErrInvalid) {
		t.Errorf("unknown scheme = %v, want ErrInvalid", err)
	}
	// Beside a PostgreSQL store a directory of one replica's is refused,
	// saying what to do; postgres without one is refused too.
	_, err = Open(t.Context(), Options{Spec: "local", Database: "postgres://db/mercator", DataDir: dir})
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "leave --content unset") {
		t.Errorf("local beside PostgreSQL = %v, want ErrInvalid saying what to do", err)
	}
	if _, err := Open(t.Context(), Options{Spec: "postgres", DataDir: dir}); !errors.Is(err, failure.ErrInvalid) {
		t.Errorf("postgres without a PostgreSQL store = %v, want ErrInvalid", err)
	}
}
