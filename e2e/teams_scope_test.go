package e2e

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/failure"
)

// TestProjectScopeForArtifactsAndRegistries (issue 17) over the real
// daemon, with one real container: Artifacts and registry credentials
// belong to projects. A token confined to vision sees and reads only
// vision's; nlp's credential for the same private registry (a wrong one)
// is not used for vision's run, nor vision's for nlp's; vision's run pulls
// the private image with vision's credential and mounts vision's Artifact;
// no run mounts another project's Artifact; and the CLI's --project
// selects.
func TestProjectScopeForArtifactsAndRegistries(t *testing.T) {
	const user = "vision-bot"
	password := "pw-" + sha256Hex([]byte(time.Now().String()))[:24]
	host := startPrivateRegistry(t, user, password)
	c := startArtifactCluster(t, nil, artifactClusterOptions{})
	private, _ := c.copyWorkload(host+"/vision/workload", user, password)
	for _, p := range []string{"vision", "nlp"} {
		if _, err := c.client.CreateProject(c.ctx, api.Project{Name: p}); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := c.client.CreateToken(c.ctx, api.TokenRequest{Name: "vision-ops", Role: "operator", Projects: []string{"vision"}})
	if err != nil {
		t.Fatal(err)
	}
	vision := c.apiClient(tok.Secret)

	// Registry credentials: each project's own, for the same host.
	if r, err := vision.AddRegistry(c.ctx, host, user, password); err != nil || r.Project != "vision" {
		t.Fatalf("vision's credential: %+v, %v", r, err)
	}
	if _, err := c.client.AddRegistryTo(c.ctx, "nlp", host, user, "not-the-password"); err != nil {
		t.Fatal(err)
	}
	if l, err := vision.ListRegistries(c.ctx); err != nil || len(l.Registries) != 1 || l.Registries[0].Project != "vision" {
		t.Errorf("vision lists registries %+v, %v", l.Registries, err)
	}
	if _, err := vision.RemoveRegistryFrom(c.ctx, "nlp", host); !errors.Is(err, failure.ErrForbidden) {
		t.Errorf("vision removing nlp's credential: %v, want forbidden", err)
	}
	// nlp's run resolves the tag with nlp's credential only, which the
	// registry refuses.
	if _, err := c.client.SubmitRun(c.ctx, api.RunSpec{Project: "nlp", Image: private, Command: []string{"echo", "nlp"}}); err == nil ||
		!strings.Contains(err.Error(), "refused access") {
		t.Errorf("nlp's run of vision's private image: %v, want the registry to refuse nlp's credential", err)
	}

	// Artifacts: a name is its project's.
	weights := []byte("vision's weights " + password)
	if v, err := vision.PushArtifact(c.ctx, "weights", client.BytesPayload(weights, "", api.ArtifactFile), client.PushOptions{}); err != nil || v.Project != "vision" {
		t.Fatalf("vision's push: %+v, %v", v, err)
	}
	if _, err := c.client.PushArtifact(c.ctx, "corpus", client.BytesPayload([]byte("nlp's corpus"), "", api.ArtifactFile), client.PushOptions{Project: "nlp"}); err != nil {
		t.Fatal(err)
	}
	if l, err := vision.ListArtifacts(c.ctx, ""); err != nil || len(l.Artifacts) != 1 || l.Artifacts[0].Name != "weights" {
		t.Errorf("vision lists Artifacts %+v, %v", l.Artifacts, err)
	}
	if _, err := vision.GetArtifact(c.ctx, "corpus", ""); !errors.Is(err, failure.ErrForbidden) {
		t.Errorf("vision reading nlp's Artifact: %v, want forbidden", err)
	}
	mount := func(name string) []api.ArtifactMount {
		return []api.ArtifactMount{{Name: name, MountPath: "/in/" + name}}
	}
	if _, err := vision.SubmitRun(c.ctx, api.RunSpec{Image: c.workload, Command: []string{"echo"}, Artifacts: mount("corpus")}); !errors.Is(err, failure.ErrInvalid) ||
		!strings.Contains(err.Error(), "does not exist") {
		t.Errorf("vision mounting nlp's Artifact: %v, want it not to exist for vision", err)
	}
	if _, err := c.client.SubmitRun(c.ctx, api.RunSpec{Project: "vision", Image: c.workload, Command: []string{"echo"}, Artifacts: mount("corpus")}); !errors.Is(err, failure.ErrInvalid) ||
		!strings.Contains(err.Error(), "belongs to project nlp") {
		t.Errorf("a vision run mounting nlp's Artifact: %v, want refused naming the project", err)
	}

	// The CLI's --project selects.
	var listed api.ArtifactList
	if err := json.Unmarshal([]byte(c.mercator("artifact", "ls", "--project", "nlp", "-o", "json")), &listed); err != nil || len(listed.Artifacts) != 1 || listed.Artifacts[0].Name != "corpus" {
		t.Errorf("artifact ls --project nlp: %+v, %v", listed.Artifacts, err)
	}
	var regs api.RegistryList
	if err := json.Unmarshal([]byte(c.mercator("registry", "ls", "--project", "vision", "-o", "json")), &regs); err != nil || len(regs.Registries) != 1 || regs.Registries[0].Username != user {
		t.Errorf("registry ls --project vision: %+v, %v", regs.Registries, err)
	}

	// Vision's run: pulled with vision's credential, its Artifact mounted.
	c.startArtifactAgent("scope", 0, nil)
	run, err := vision.SubmitRun(c.ctx, api.RunSpec{Image: private, Command: []string{"sha256", "/in/weights"}, Artifacts: mount("weights")})
	if err != nil {
		t.Fatal(err)
	}
	if done := c.wait(run.ID); done.Status != api.RunSucceeded || done.Project != "vision" {
		t.Fatalf("vision's run: %s %q (project %s), attempts %q", done.Status, done.Reason, done.Project, attemptErrors(done))
	}
	if got := c.logsHaving(run.ID, sha256Hex(weights)); !strings.Contains(got, sha256Hex(weights)) {
		t.Errorf("vision's run read %q, want its Artifact's digest %s", got, sha256Hex(weights))
	}
}
