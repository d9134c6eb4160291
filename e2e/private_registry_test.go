package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/internal/logbuffer"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/testimage"
	"github.com/mercator/mercator/nodeagent/dockerruntime"
	"github.com/mercator/mercator/nodeproto"
)

// startPrivateRegistry runs an OCI registry on loopback that answers only
// requests with the given basic credential, as a private registry does.
func startPrivateRegistry(t *testing.T, user, password string) string {
	t.Helper()
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="mercator-test"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`))
			return
		}
		inner.ServeHTTP(w, r)
	})
	l, err := listenLoopback()
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// copyWorkload copies the cluster's workload image into repo (a private
// registry's host/repository) as tag 1, pushing with the given credential,
// and returns the tagged and the digest-pinned references. The daemon's
// copy of the pinned reference is removed when the test ends.
func (c *cluster) copyWorkload(repo, user, password string) (tagged, pinned string) {
	t := c.t
	t.Helper()
	src, err := name.ParseReference(c.workload, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(src)
	if err != nil {
		t.Fatal(err)
	}
	tagged = repo + ":1"
	dst, err := name.ParseReference(tagged, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(dst, img, remote.WithAuth(&authn.Basic{Username: user, Password: password})); err != nil {
		t.Fatalf("copy the workload image into the private registry: %v", err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	pinned = repo + "@" + digest.String()
	t.Cleanup(func() { testimage.Untag(context.Background(), pinned) })
	return tagged, pinned
}

// TestPrivateRegistry: an image in a registry that requires a credential
// is resolved and pulled with the credential stored on the control plane,
// fails clearly without it, and afterwards the credential is nowhere on
// disk where the node or the control plane keep things, nor in a Docker
// configuration file, nor in any log line.
func TestPrivateRegistry(t *testing.T) {
	const user = "robot"
	password := "pw-" + sha256Hex([]byte(time.Now().String()))[:24]
	host := startPrivateRegistry(t, user, password)

	var serverLog, agentLog logbuffer.Buffer
	c := startArtifactCluster(t, nil, artifactClusterOptions{mutate: func(o *daemon.ServerOptions) { o.Logger = slogTo(&serverLog) }})

	private, pinned := c.copyWorkload(host+"/private/workload", user, password)

	// Without a credential: refused at submit, saying what to do.
	_, err := c.client.SubmitRun(c.ctx, api.RunSpec{Image: private, Command: []string{"echo", "hi"}})
	if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "no credentials are stored for "+host) {
		t.Fatalf("submit without a credential: %v", err)
	}

	// With one, stored through the CLI from stdin.
	if _, errOut, code := c.mercatorExit(password+"\n", "registry", "add", host, "--username", user, "--password-stdin"); code != 0 {
		t.Fatalf("registry add: exit %d: %s", code, errOut)
	}
	if ls := c.mercator("registry", "ls", "-o", "json"); !strings.Contains(ls, host) || strings.Contains(ls, password) {
		t.Fatalf("registry ls:\n%s", ls)
	}
	// Queued before any node exists, so its launch is sent later.
	queued := c.submit(api.RunSpec{Image: private, Command: []string{"echo", "queued"}})
	if queued.PinnedImage != pinned {
		t.Fatalf("pinned %s, want %s", queued.PinnedImage, pinned)
	}

	// The credential removed before the node hears of the run: the pull
	// fails, and says the registry refused it.
	c.mercator("registry", "rm", host)
	nodeID := c.startArtifactAgent("n", 0, &agentLog)
	done := c.wait(queued.ID)
	if done.Status != api.RunFailed || !strings.Contains(strings.ToLower(attemptErrors(done)), "pull image") {
		t.Fatalf("run without a credential at pull time = %s, %q, attempts %q", done.Status, done.Reason, attemptErrors(done))
	}
	t.Logf("pull without the credential: %s", attemptErrors(done))

	// The node's own runtime, handed no credential, refuses clearly. (Asked
	// before any pull of this image succeeded: a daemon that once pulled a
	// digest serves it again from its own store.)
	rt, err := dockerruntime.New("")
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	err = rt.PrepareImage(c.ctx, nodeproto.PrepareImageCommand{Image: pinned})
	if !errors.Is(err, failure.ErrUnauthorized) {
		t.Errorf("a pull without the credential: %v, want ErrUnauthorized", err)
	}

	// Stored again: the pull succeeds with it.
	if _, errOut, code := c.mercatorExit(password+"\n", "registry", "add", host, "--username", user, "--password-stdin"); code != 0 {
		t.Fatalf("registry add: %s", errOut)
	}
	run := c.submit(api.RunSpec{Image: private, Command: []string{"echo", "pulled with the stored credential"}})
	done = c.wait(run.ID)
	if done.Status != api.RunSucceeded || !strings.Contains(c.logsHaving(run.ID, "pulled with the stored credential"), "pulled with the stored credential") {
		t.Fatalf("run with the credential = %s %q %q", done.Status, done.Reason, attemptErrors(done))
	}

	// Nowhere on disk, nowhere in the logs.
	authValue, _ := json.Marshal(map[string]string{"username": user, "password": password, "serveraddress": host})
	needles := [][]byte{[]byte(password), []byte(base64.URLEncoding.EncodeToString(authValue)), []byte(base64.StdEncoding.EncodeToString([]byte(user + ":" + password)))}
	places := []string{c.agentState(nodeID), c.dataDir, filepath.Join(os.Getenv("HOME"), ".docker"), "/root/.docker", "/etc/docker"}
	if d := os.Getenv("DOCKER_CONFIG"); d != "" {
		places = append(places, d)
	}
	for _, place := range places {
		searchTree(t, place, needles)
	}
	for what, logs := range map[string]string{"server log": serverLog.String(), "agent log": agentLog.String()} {
		if logs == "" {
			t.Errorf("the %s is empty: the search would prove nothing", what)
		}
		for _, n := range needles {
			if bytes.Contains([]byte(logs), n) {
				t.Errorf("the %s contains the credential", what)
			}
		}
	}
	_ = nodeID
}

// searchTree fails the test for every file under root holding any needle.
func searchTree(t *testing.T, root string, needles [][]byte) {
	t.Helper()
	files := 0
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		files++
		for _, n := range needles {
			if bytes.Contains(data, n) {
				t.Errorf("%s holds a secret in the clear", p)
			}
		}
		return nil
	})
	t.Logf("searched %d files under %s", files, root)
}
