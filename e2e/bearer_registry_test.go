package e2e

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/registrytest"
)

// TestPrivateRegistryBearer: against a registry that hands out bearer
// tokens, as Docker Hub, ghcr.io and Harbor do (a 401 challenge naming a
// token realm, a token endpoint that checks the stored credential and
// issues a short-lived token scoped to the repository), the control plane
// resolves the tag to a digest and the node's Docker daemon pulls the
// pinned image, both through the token flow with the credential Mercator
// stores, and the Run succeeds. A wrong stored password is refused at
// submit, saying the registry refused the stored credential, and a pull
// with it fails on the node. The registry's counters show the token path
// was taken by both clients and nothing was served without a token.
func TestPrivateRegistryBearer(t *testing.T) {
	const user = "robot"
	password := "pw-" + sha256Hex([]byte(time.Now().String()))[:24]
	reg := registrytest.StartBearer(t, registrytest.BearerOptions{User: user, Password: password, TTL: time.Minute})
	host := reg.Host

	c := startArtifactCluster(t, nil, artifactClusterOptions{})
	private, pinned := c.copyWorkload(host+"/private/workload", user, password)
	if n := reg.ServedTo("mercator"); n != 0 {
		t.Fatalf("%d requests from the control plane before anything was submitted", n)
	}

	addCredential := func(pw string) {
		t.Helper()
		if _, errOut, code := c.mercatorExit(pw+"\n", "registry", "add", host, "--username", user, "--password-stdin"); code != 0 {
			t.Fatalf("registry add: exit %d: %s", code, errOut)
		}
	}

	// The right credential: the tag resolves through the token flow.
	// Queued before any node exists, so its launch is sent later.
	addCredential(password)
	queued := c.submit(api.RunSpec{Image: private, Command: []string{"echo", "queued"}})
	if queued.PinnedImage != pinned {
		t.Fatalf("pinned %s, want %s", queued.PinnedImage, pinned)
	}
	if reg.ServedTo("mercator") == 0 {
		t.Fatalf("the control plane resolved %s without a request served under a token: counts %+v", private, reg.Counts())
	}

	// A wrong password replaces it: the token endpoint refuses it, and the
	// submit is refused with what to fix.
	refusedBefore := reg.Counts().TokensRefused
	addCredential(password + "-wrong")
	_, stderr, code := c.mercatorExit("", "run", "submit", "--image", private, "--", "echo", "never")
	if code == 0 || !strings.Contains(stderr, "registry "+host+" refused access (HTTP 401)") ||
		!strings.Contains(stderr, "the credentials stored for "+host+" were refused") {
		t.Fatalf("submit with a wrong stored password: exit %d, stderr:\n%s", code, stderr)
	}
	t.Logf("what the user sees when the stored password is wrong:\n%s", strings.TrimSpace(stderr))
	_, err := c.client.SubmitRun(c.ctx, api.RunSpec{Image: private, Command: []string{"echo", "never"}})
	if !errors.Is(err, failure.ErrInvalid) {
		t.Errorf("submit with a wrong stored password through the API: %v, want ErrInvalid", err)
	}
	if reg.Counts().TokensRefused == refusedBefore {
		t.Errorf("the token endpoint refused nothing: the wrong password never reached it")
	}

	// The node hears of the queued run while the stored password is wrong:
	// its Docker daemon is refused a token, and the run fails saying so.
	// (Asked before any pull of this image succeeded: a daemon that once
	// pulled a digest serves it again from its own store.)
	refusedBefore = reg.Counts().TokensRefused
	c.startArtifactAgent("n", 0, nil)
	done := c.wait(queued.ID)
	if done.Status != api.RunFailed || !strings.Contains(strings.ToLower(attemptErrors(done)), "pull image") {
		t.Fatalf("run pulled with a wrong password = %s, %q, attempts %q", done.Status, done.Reason, attemptErrors(done))
	}
	t.Logf("the node's pull with the wrong password: %s", attemptErrors(done))
	if reg.Counts().TokensRefused == refusedBefore {
		t.Errorf("the node's daemon was never refused a token: counts %+v", reg.Counts())
	}
	if n := reg.ServedTo("docker/"); n != 0 {
		t.Errorf("%d requests served to the Docker daemon with a wrong password", n)
	}

	// The right password again: the daemon pulls through the token flow
	// and the run succeeds.
	addCredential(password)
	run := c.submit(api.RunSpec{Image: private, Command: []string{"echo", "pulled through a bearer token"}})
	done = c.wait(run.ID)
	if done.Status != api.RunSucceeded || !strings.Contains(c.logsHaving(run.ID, "pulled through a bearer token"), "pulled through a bearer token") {
		t.Fatalf("run with the stored credential = %s %q %q", done.Status, done.Reason, attemptErrors(done))
	}

	counts := reg.Counts()
	t.Logf("bearer registry: %+v; served under a token to the daemon %d, to the control plane %d",
		counts, reg.ServedTo("docker/"), reg.ServedTo("mercator"))
	if counts.TokensIssued == 0 || counts.ServedWithToken == 0 || counts.Challenged == 0 {
		t.Errorf("the token path was not exercised: %+v", counts)
	}
	if counts.ServedWithoutToken != 0 {
		t.Errorf("%d registry requests were served without a token", counts.ServedWithoutToken)
	}
	if reg.ServedTo("docker/") == 0 {
		t.Errorf("the Docker daemon pulled %s without a request served under a token", pinned)
	}
}
