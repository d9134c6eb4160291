package e2e

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/internal/logbuffer"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/daemon"
)

// TestArtifactS3ContentStore: with a real S3-compatible content store
// (SeaweedFS, started by the test on loopback, checking signatures and
// expiry), a pushed version lands in the bucket and the node reads it
// straight from the bucket through a presigned GET; the bucket's key
// appears in no byte between the node and the control plane (the wire is
// recorded, and must have carried the presigned read, so the search proves
// something) nor in the agent's log. The server refuses the node's
// presigned read with one character of its signature changed, and a read
// minted by the same presigner once it has expired.
func TestArtifactS3ContentStore(t *testing.T) {
	const access, secret = "mercator-test", "control-plane-secret-key"
	weed := startSeaweedS3(t, access, secret, "artifacts")

	// A proxy in front of the gateway counts and keeps the presigned reads
	// (it passes the Host header through, so signatures still match).
	var (
		s3reads   atomic.Int32
		readsMu   sync.Mutex
		readPaths []string
	)
	gateway := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: weed.Endpoint})
	bucket := strings.TrimPrefix(httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Query().Get("X-Amz-Signature") != "" {
			s3reads.Add(1)
			readsMu.Lock()
			readPaths = append(readPaths, r.URL.RequestURI())
			readsMu.Unlock()
		}
		gateway.ServeHTTP(w, r)
	})), "http://")
	t.Setenv("AWS_ACCESS_KEY_ID", access)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	spec := "s3://artifacts/fleet?endpoint=" + bucket + "&insecure=true&region=us-east-1"
	c := startArtifactCluster(t, nil, artifactClusterOptions{mutate: func(o *daemon.ServerOptions) { o.Content = spec }})
	wire := c.recordWire()
	var agentLog logbuffer.Buffer
	c.startArtifactAgent("n", 0, &agentLog)
	data := bytes.Repeat([]byte("from the bucket\n"), 50_000)
	v := pushBytes(t, c, "data", data)
	run := c.submit(api.RunSpec{Command: []string{"sha256", "/d"}, Artifacts: []api.ArtifactMount{{Name: "data", MountPath: "/d"}}})
	done := c.wait(run.ID)
	if done.Status != api.RunSucceeded || !strings.Contains(c.logsHaving(run.ID, v.SHA256), v.SHA256) {
		t.Fatalf("run = %s (%s %s) logs %q", done.Status, done.Reason, attemptErrors(done), c.logs(run.ID))
	}
	if s3reads.Load() == 0 {
		t.Fatal("the node did not read from the bucket through a presigned GET")
	}
	if _, err := os.Stat(filepath.Join(c.dataDir, "content", "sha256", v.SHA256[:2], v.SHA256)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("with an S3 store the content is also in the local directory (%v)", err)
	}
	if !wire.contains("X-Amz-Signature") {
		t.Fatal("the recorded wire never carried the presigned read: the search for the key would prove nothing")
	}
	if wire.contains(secret) {
		t.Error("the bucket's secret key went over the wire between the node and the control plane")
	}
	if strings.Contains(agentLog.String(), secret) {
		t.Error("the agent's log holds the bucket's secret key")
	}

	// The node's own presigned read, sent again: served as it was. With one
	// character of its signature changed: refused by the server.
	readsMu.Lock()
	nodeRead := "http://" + bucket + readPaths[0]
	readsMu.Unlock()
	if code, body := s3Get(t, nodeRead); code != http.StatusOK || !bytes.Equal([]byte(body), data) {
		t.Fatalf("the node's presigned read sent again = %d (%d bytes), want 200 with the content", code, len(body))
	}
	u, err := url.Parse(nodeRead)
	if err != nil {
		t.Fatal(err)
	}
	sig := u.Query().Get("X-Amz-Signature")
	wrong := "1" + sig[1:]
	if sig[0] == '1' {
		wrong = "0" + sig[1:]
	}
	tampered := strings.Replace(nodeRead, "X-Amz-Signature="+sig, "X-Amz-Signature="+wrong, 1)
	code, body := s3Get(t, tampered)
	if code != http.StatusForbidden || !strings.Contains(body, "SignatureDoesNotMatch") {
		t.Errorf("a presigned read with a wrong signature = %d %q, want 403 SignatureDoesNotMatch", code, body)
	}
	t.Logf("a presigned read with a wrong signature: %d %s", code, body)

	// A read minted by the control plane's presigner with a one-second
	// life, used once that second has passed on the clock the server
	// checks: refused as expired. (The wait is for wall-clock time itself,
	// the property under test, not for another goroutine.)
	store, err := content.Open(t.Context(), content.Options{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	short, exp, err := store.ReadURL(c.ctx, v.SHA256, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(exp.Add(time.Second)))
	code, body = s3Get(t, short)
	if code != http.StatusForbidden || !strings.Contains(body, "Request has expired") {
		t.Errorf("an expired presigned read = %d %q, want 403 Request has expired", code, body)
	}
	t.Logf("an expired presigned read: %d %s", code, body)
}

// s3Get fetches url without credentials and returns the status and body.
func s3Get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}
