package controlplane

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane/internal/runsecrets"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// storeRun stores a queued run of project (with secrets sealed under
// srv's key when given), as an admitted one would be, for the send path.
func storeRun(t *testing.T, st store.Store, id, project string) {
	t.Helper()
	storeRunWith(t, st, nil, store.Run{Run: api.Run{ID: id, RunSpec: api.RunSpec{Project: project}, Status: api.RunQueued, CreatedAt: time.Now()}})
}

func storeRunWith(t *testing.T, st store.Store, srv *Server, run store.Run) {
	t.Helper()
	if srv != nil {
		if err := runsecrets.Seal(serverKey{srv}, &run); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Update(context.Background(), func(tx store.Tx) error { return tx.CreateRun(run) }); err != nil {
		t.Fatal(err)
	}
}

// confined is a client with a token confined to projects, and the token.
type confined struct {
	*client.Client
	token string
}

// confinedClient creates projects and an operator token confined to the
// first, and returns a client with it.
func (f *artifactFixture) confinedClient(t *testing.T, projects ...string) confined {
	t.Helper()
	ctx := context.Background()
	for _, p := range projects {
		if _, err := f.client.CreateProject(ctx, api.Project{Name: p, Pools: poolsOf(p)}); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := f.client.CreateToken(ctx, api.TokenRequest{Name: projects[0] + "-ops", Role: "operator", Projects: projects[:1]})
	if err != nil {
		t.Fatal(err)
	}
	return confined{client.New(f.http.URL, tok.Secret, nil), tok.Secret}
}

// poolsOf restricts the project named "secure" to the pool "secure".
func poolsOf(project string) []string {
	if project == "secure" {
		return []string{"secure"}
	}
	return nil
}

func wantRefused(t *testing.T, what string, err error, kind error, says string) {
	t.Helper()
	if !errors.Is(err, kind) || !strings.Contains(err.Error(), says) {
		t.Errorf("%s: %v, want %v saying %q", what, err, kind, says)
	}
}

// TestArtifactsByProject: an Artifact name is its first push's project's;
// a token confined to vision lists and reads only vision's names, pushes
// into them only, and a run mounts only its own project's Artifacts.
func TestArtifactsByProject(t *testing.T) {
	f := newArtifactFixture(t)
	ctx := context.Background()
	vision := f.confinedClient(t, "vision", "nlp")
	push := func(c *client.Client, name, project, content string) (api.ArtifactVersion, error) {
		return c.PushArtifact(ctx, name, client.BytesPayload([]byte(content), "", api.ArtifactFile), client.PushOptions{Project: project})
	}
	if v, err := push(f.client, "corpus", "nlp", "nlp's corpus"); err != nil || v.Project != "nlp" {
		t.Fatalf("push to nlp = %+v, %v", v, err)
	}
	if v, err := push(f.client, "shared", "", "everyone's"); err != nil || v.Project != api.DefaultProject {
		t.Fatalf("push naming no project = %+v, %v", v, err)
	}
	if v, err := push(vision.Client, "weights", "", "vision's weights"); err != nil || v.Project != "vision" {
		t.Fatalf("a confined push = %+v, %v; want it in the token's project", v, err)
	}
	if v, err := push(vision.Client, "weights", "", "vision's weights, v2"); err != nil || v.Version != "v2" {
		t.Fatalf("a second version = %+v, %v", v, err)
	}
	_, err := push(f.client, "weights", "nlp", "nlp's weights")
	wantRefused(t, "a push to another project's name", err, failure.ErrConflict, "belongs to project vision")
	_, err = push(vision.Client, "corpus", "", "vision's corpus")
	wantRefused(t, "a confined push to another project's name", err, failure.ErrForbidden, `confined to project(s) vision`)
	_, err = push(vision.Client, "new", "nlp", "x")
	wantRefused(t, "a confined push to another project", err, failure.ErrForbidden, `project "nlp"`)

	list, err := vision.ListArtifacts(ctx, "")
	if err != nil || len(list.Artifacts) != 2 || list.Artifacts[0].Name != "weights" {
		t.Errorf("a confined listing = %+v, %v; want vision's two versions", list.Artifacts, err)
	}
	_, err = vision.ListArtifactsOf(ctx, "nlp", "")
	wantRefused(t, "a confined listing of another project", err, failure.ErrForbidden, "may not list Artifacts")
	_, err = vision.GetArtifact(ctx, "corpus", "")
	wantRefused(t, "a confined read of another project's", err, failure.ErrForbidden, "may not read Artifacts")
	if status, _ := f.callAs(t, vision, "GET", "/v1/artifacts/corpus"); status != http.StatusForbidden {
		t.Errorf("a confined read of another project's versions = %d", status)
	}
	all, err := f.client.ListArtifactsOf(ctx, "nlp", "")
	if err != nil || len(all.Artifacts) != 1 || all.Artifacts[0].Name != "corpus" {
		t.Errorf("?project=nlp = %+v, %v", all.Artifacts, err)
	}

	spec := api.RunSpec{Project: "nlp", Artifacts: []api.ArtifactMount{{Name: "weights", MountPath: "/w"}}}
	err = f.srv.resolveArtifacts(ctx, &spec)
	wantRefused(t, "a run mounting another project's Artifact", err, failure.ErrInvalid, "belongs to project vision; a run of project nlp mounts only its own project's Artifacts")
	spec = api.RunSpec{Project: "vision", Artifacts: []api.ArtifactMount{{Name: "weights", MountPath: "/w"}}}
	if err := f.srv.resolveArtifacts(ctx, &spec); err != nil || spec.Artifacts[0].Version != "v2" {
		t.Errorf("a run mounting its own project's = %+v, %v", spec.Artifacts, err)
	}
}

// callAs is call with c's token.
func (f *artifactFixture) callAs(t *testing.T, c confined, method, path string) (int, []byte) {
	t.Helper()
	admin := f.token
	f.token = c.token
	defer func() { f.token = admin }()
	return f.call(t, method, path, nil)
}

// TestRegistryCredentialsByProject: each project holds its own credential
// for a host; a confined token sees and removes only its project's; a
// launch pulls with its run's project's credential and no other's; and a
// launch's credential and secrets go only to a node in the project's
// pools.
func TestRegistryCredentialsByProject(t *testing.T) {
	f := newArtifactFixture(t)
	ctx := context.Background()
	vision := f.confinedClient(t, "vision", "nlp", "secure")
	for _, c := range []struct {
		cl      *client.Client
		project string
		user    string
	}{{f.client, "nlp", "nlp-bot"}, {vision.Client, "", "vision-bot"}, {f.client, "secure", "secure-bot"}} {
		if r, err := c.cl.AddRegistryTo(ctx, c.project, "ghcr.io", c.user, c.user+"-password"); err != nil || r.Project == "" {
			t.Fatalf("add %s's = %+v, %v", c.user, r, err)
		}
	}
	mine, err := vision.ListRegistries(ctx)
	if err != nil || len(mine.Registries) != 1 || mine.Registries[0].Project != "vision" || mine.Registries[0].Username != "vision-bot" {
		t.Errorf("a confined listing = %+v, %v", mine.Registries, err)
	}
	all, err := f.client.ListRegistries(ctx)
	if err != nil || len(all.Registries) != 3 {
		t.Errorf("the admin's listing = %+v, %v", all.Registries, err)
	}
	_, err = vision.RemoveRegistryFrom(ctx, "nlp", "ghcr.io")
	wantRefused(t, "a confined removal of another project's", err, failure.ErrForbidden, "may not remove registry credentials")
	_, err = vision.ListRegistriesOf(ctx, "nlp")
	wantRefused(t, "a confined listing of another project's", err, failure.ErrForbidden, "may not list registry credentials")

	image := "ghcr.io/team/app@sha256:" + strings.Repeat("d", 64)
	launchOf := func(runID string) nodeproto.Command {
		return nodeproto.Command{Kind: nodeproto.KindLaunchWorkload, LaunchWorkload: &nodeproto.LaunchWorkloadCommand{
			WorkloadKey: nodeproto.WorkloadKey{RunID: runID, Attempt: 1}, Image: image, SecretNames: secretNamesOf(runID)}}
	}
	storeRun(t, f.st, "r-vision", "vision")
	storeRun(t, f.st, "r-nlp", "nlp")
	storeRun(t, f.st, "r-default", "")
	for run, want := range map[string]string{"r-vision": "vision-bot", "r-nlp": "nlp-bot", "r-default": ""} {
		if got := authUser(t, f.srv.outbound(ctx, "n1", launchOf(run)).LaunchWorkload.RegistryAuth); got != want {
			t.Errorf("%s pulls as %q, want %q", run, got, want)
		}
	}

	// Pools: the secure project's launch carries its credential and secret
	// to a node in pool secure, and neither to one outside it.
	storeRunWith(t, f.st, f.srv, store.Run{Run: api.Run{ID: "r-secure", RunSpec: api.RunSpec{Project: "secure",
		Secrets: map[string]string{"API_KEY": "k-123"}}, Status: api.RunQueued, CreatedAt: time.Now()}})
	now := time.Now()
	err = f.st.Update(ctx, func(tx store.Tx) error {
		for id, labels := range map[string]map[string]string{"n-in": {"pool": "secure"}, "n-out": {"pool": "general"}} {
			if err := tx.PutNode(store.Node{ID: id, CreatedAt: now, Labels: labels}); err != nil {
				return err
			}
		}
		// An agent's own label counts as the operator's does.
		return tx.PutNode(store.Node{ID: "n-agent", CreatedAt: now, Facts: &nodeproto.NodeFacts{Labels: map[string]string{"pool": "secure"}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	for node, inPool := range map[string]bool{"n-in": true, "n-agent": true, "n-out": false, "n-gone": false} {
		l := f.srv.outbound(ctx, node, launchOf("r-secure")).LaunchWorkload
		gotAuth, gotSecret := authUser(t, l.RegistryAuth), l.Secrets["API_KEY"]
		if inPool && (gotAuth != "secure-bot" || gotSecret != "k-123") {
			t.Errorf("to %s, in the pool: auth %q, secret %q; want both", node, gotAuth, gotSecret)
		}
		if !inPool && (l.RegistryAuth != "" || len(l.Secrets) != 0) {
			t.Errorf("to %s, outside the pool: auth %q, secrets %v; want neither", node, gotAuth, l.Secrets)
		}
	}
}

func secretNamesOf(runID string) []string {
	if runID == "r-secure" {
		return []string{"API_KEY"}
	}
	return nil
}

// authUser is the username in an X-Registry-Auth value ("" for none).
func authUser(t *testing.T, auth string) string {
	t.Helper()
	if auth == "" {
		return ""
	}
	raw, err := base64.URLEncoding.DecodeString(auth)
	var v map[string]string
	if err == nil {
		err = json.Unmarshal(raw, &v)
	}
	if err != nil {
		t.Fatalf("registry auth %q: %v", auth, err)
	}
	return v["username"]
}

// TestAppsByProject: a token confined to vision lists only vision's apps,
// and reads, changes, removes or adds functions to another project's app
// never.
func TestAppsByProject(t *testing.T) {
	f := newArtifactFixture(t)
	vision := f.confinedClient(t, "vision", "nlp")
	fnCall := func(token, method, path string, body any) (int, []byte) {
		t.Helper()
		b, _ := json.Marshal(body)
		admin := f.token
		f.token = token
		defer func() { f.token = admin }()
		if body == nil {
			return f.call(t, method, path, nil)
		}
		return f.call(t, method, path, bytes.NewReader(b))
	}
	var nlpApp, visionApp api.App
	for _, c := range []struct {
		token string
		app   api.App
		out   *api.App
	}{{f.token, api.App{Name: "tagger", Project: "nlp"}, &nlpApp}, {vision.token, api.App{Name: "detector"}, &visionApp}} {
		status, body := fnCall(c.token, "POST", "/v2/apps", c.app)
		if status != http.StatusOK || json.Unmarshal(body, c.out) != nil {
			t.Fatalf("create app %s: %d %s", c.app.Name, status, body)
		}
	}
	if visionApp.Project != "vision" {
		t.Errorf("a confined token's app is in %q", visionApp.Project)
	}
	status, body := fnCall(vision.token, "GET", "/v2/apps", nil)
	var list api.AppList
	if status != http.StatusOK || json.Unmarshal(body, &list) != nil || len(list.Items) != 1 || list.Items[0].Name != "detector" {
		t.Errorf("a confined listing: %d %s", status, body)
	}
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/v2/apps/" + nlpApp.ID, nil},
		{"PUT", "/v2/apps/" + nlpApp.ID, api.App{Config: map[string]string{"A": "b"}}},
		{"DELETE", "/v2/apps/" + nlpApp.ID, nil},
		{"GET", "/v2/fns?app_id=" + nlpApp.ID, nil},
		{"POST", "/v2/fns", map[string]string{"app_id": nlpApp.ID, "name": "f", "image": "127.0.0.1:5000/f:1"}},
		{"GET", "/v2/triggers?app_id=" + nlpApp.ID, nil},
	} {
		status, body := fnCall(vision.token, c.method, c.path, c.body)
		if status != http.StatusForbidden || !strings.Contains(string(body), `may not use apps of project \"nlp\"`) {
			t.Errorf("a confined %s %s: %d %s; want 403", c.method, c.path, status, body)
		}
	}
	status, body = fnCall(f.token, "GET", "/v2/apps", nil)
	list = api.AppList{}
	if status != http.StatusOK || json.Unmarshal(body, &list) != nil || !slices.ContainsFunc(list.Items, func(a api.App) bool { return a.ID == nlpApp.ID }) {
		t.Errorf("the admin's listing: %d %s", status, body)
	}
	if status, body := fnCall(vision.token, "GET", "/v2/apps/"+visionApp.ID, nil); status != http.StatusOK {
		t.Errorf("a confined read of its own app: %d %s", status, body)
	}
}

// TestRegistryPasswordBoundToItsProject: a sealed password copied into
// another project's record for the same host does not open there, so a
// database edit cannot lend one project's credential to another; the
// default project's binding is the host alone, as before projects.
func TestRegistryPasswordBoundToItsProject(t *testing.T) {
	f := newArtifactFixture(t)
	ctx := context.Background()
	f.confinedClient(t, "vision", "nlp")
	if _, err := f.client.AddRegistryTo(ctx, "vision", "ghcr.io", "vision-bot", "vision-password"); err != nil {
		t.Fatal(err)
	}
	err := f.st.Update(ctx, func(tx store.Tx) error {
		c, err := tx.GetRegistryCredential("vision", "ghcr.io")
		if err != nil {
			return err
		}
		c.Project = "nlp"
		return tx.PutRegistryCredential(c)
	})
	if err != nil {
		t.Fatal(err)
	}
	storeRun(t, f.st, "r-nlp", "nlp")
	storeRun(t, f.st, "r-vision", "vision")
	launch := func(run string) nodeproto.Command {
		return nodeproto.Command{Kind: nodeproto.KindLaunchWorkload, LaunchWorkload: &nodeproto.LaunchWorkloadCommand{
			WorkloadKey: nodeproto.WorkloadKey{RunID: run, Attempt: 1}, Image: "ghcr.io/x/y@sha256:" + strings.Repeat("e", 64)}}
	}
	if got := authUser(t, f.srv.outbound(ctx, "n1", launch("r-nlp")).LaunchWorkload.RegistryAuth); got != "" {
		t.Errorf("nlp pulls with vision's sealed password moved into its record, as %q", got)
	}
	if got := authUser(t, f.srv.outbound(ctx, "n1", launch("r-vision")).LaunchWorkload.RegistryAuth); got != "vision-bot" {
		t.Errorf("vision pulls as %q, want vision-bot", got)
	}
}
