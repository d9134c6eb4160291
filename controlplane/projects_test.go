package controlplane

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// TestProjectsLifecycle drives the project routes over real HTTP and a
// store: the default project is there before anyone creates it and cannot
// be removed; a created project is read back as stored, replaced whole by
// an update and refused when the body renames it; a run names an existing
// project or none (default), is listed by project, and keeps its project
// from being removed until it finishes.
func TestProjectsLifecycle(t *testing.T) {
	f := newRunsFixture(t)
	var list api.ProjectList
	f.want(http.StatusOK, &list, "GET", "/v1/projects", nil)
	if len(list.Projects) != 1 || list.Projects[0].Name != api.DefaultProject {
		t.Fatalf("projects before any = %+v, want only default", list.Projects)
	}
	f.refusedAs(http.StatusBadRequest, "name", "cannot be removed", "DELETE", "/v1/projects/default", nil)

	vision := api.Project{Name: "vision", Quota: api.Quota{GPUs: map[string]int{"H100": 16}, CPU: 256}, MaxRunning: 40, Weight: 2, Pools: []string{"secure"}}
	var got api.Project
	f.want(http.StatusCreated, &got, "POST", "/v1/projects", vision)
	if got.Quota.GPUs["H100"] != 16 || got.Weight != 2 || got.CreatedAt.IsZero() {
		t.Errorf("created = %+v", got)
	}
	f.refusedAs(http.StatusConflict, "", "vision", "POST", "/v1/projects", vision)
	f.refusedAs(http.StatusBadRequest, "quota.gpus", "contains", "POST", "/v1/projects",
		api.Project{Name: "x", Quota: api.Quota{GPUs: map[string]int{"H100": 1, "H100-80GB": 1}}})
	f.refusedAs(http.StatusBadRequest, "name", "project name", "POST", "/v1/projects", api.Project{Name: "Vision Team"})

	vision.Quota = api.Quota{GPUs: map[string]int{"A100": 8}}
	f.want(http.StatusOK, nil, "PUT", "/v1/projects/vision", vision)
	got = api.Project{}
	f.want(http.StatusOK, &got, "GET", "/v1/projects/vision", nil)
	if got.Quota.GPUs["A100"] != 8 || got.Quota.GPUs["H100"] != 0 || got.Quota.CPU != 0 {
		t.Errorf("after update = %+v, want the body's quota whole", got)
	}
	f.refusedAs(http.StatusBadRequest, "name", "cannot be renamed", "PUT", "/v1/projects/vision", api.Project{Name: "nlp"})
	f.want(http.StatusOK, &got, "PUT", "/v1/projects/default", api.Project{Weight: 3})
	f.want(http.StatusOK, &list, "GET", "/v1/projects", nil)
	if names := projectNames(list); !slices.Equal(names, []string{"default", "vision"}) || list.Projects[0].Weight != 3 {
		t.Errorf("projects = %+v", list.Projects)
	}

	spec := api.RunSpec{Image: "127.0.0.1:5000/hello:1", Command: []string{"/hello"}}
	var plain, inVision api.Run
	f.want(http.StatusCreated, &plain, "POST", "/v1/runs", spec)
	spec.Project, spec.Priority = "vision", 100
	f.want(http.StatusCreated, &inVision, "POST", "/v1/runs", spec)
	if plain.Project != api.DefaultProject || inVision.Project != "vision" || inVision.Priority != 100 {
		t.Errorf("runs' projects = %q, %q (priority %d)", plain.Project, inVision.Project, inVision.Priority)
	}
	spec.Project = "nlp"
	f.refusedAs(http.StatusBadRequest, "project", "does not exist", "POST", "/v1/runs", spec)
	var runs api.RunList
	f.want(http.StatusOK, &runs, "GET", "/v1/runs?project=vision", nil)
	if len(runs.Runs) != 1 || runs.Runs[0].ID != inVision.ID {
		t.Errorf("vision's runs = %+v", runs.Runs)
	}
	f.refusedAs(http.StatusConflict, "", inVision.ID, "DELETE", "/v1/projects/vision", nil)
	f.want(http.StatusOK, nil, "POST", "/v1/runs/"+inVision.ID+"/cancel", nil)
	f.want(http.StatusOK, &got, "DELETE", "/v1/projects/vision", nil)
	f.refusedAs(http.StatusNotFound, "", "project ls", "GET", "/v1/projects/vision", nil)
}

func projectNames(l api.ProjectList) []string {
	var out []string
	for _, p := range l.Projects {
		out = append(out, p.Name)
	}
	return out
}

// refusedAs calls a route and checks the answer is status in the API's
// error shape, naming field (when not "") and saying says.
func (f *runsFixture) refusedAs(status int, field, says, method, path string, body any) {
	f.t.Helper()
	got, _, data := f.do(method, path, body)
	var e api.Error
	if err := json.Unmarshal(data, &e); err != nil {
		f.t.Fatalf("%s %s: answer %d %s is not the API's error shape: %v", method, path, got, data, err)
	}
	if got != status || (field != "" && e.Error.Field != field) || !strings.Contains(e.Error.Message, says) {
		f.t.Errorf("%s %s = %d %s, want %d naming %q and saying %q", method, path, got, data, status, field, says)
	}
}

// TestQueuePositions: after a pass, a queued run shows its place in its
// project's queue (priority first, then submission), the runs just ahead,
// and the queue lists in that order; another project's runs are not in it.
func TestQueuePositions(t *testing.T) {
	f := newRunsFixture(t)
	f.want(http.StatusCreated, nil, "POST", "/v1/projects", api.Project{Name: "vision"})
	spec := api.RunSpec{Image: "127.0.0.1:5000/hello:1", Command: []string{"/hello"}, Project: "vision", CPU: 1}
	var ids []string
	for _, priority := range []int{0, 0, 100} {
		spec.Priority = priority
		var r api.Run
		f.want(http.StatusCreated, &r, "POST", "/v1/runs", spec)
		ids = append(ids, r.ID)
	}
	f.want(http.StatusCreated, nil, "POST", "/v1/runs", api.RunSpec{Image: spec.Image, Command: spec.Command})
	if err := f.srv.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got api.Run
	f.want(http.StatusOK, &got, "GET", "/v1/runs/"+ids[1], nil)
	if q := got.Queue; q == nil || q.Project != "vision" || q.Position != 3 || q.Of != 3 || !slices.Equal(q.Ahead, []string{ids[2], ids[0]}) {
		t.Errorf("queue position of the second run at priority 0: %+v", got.Queue)
	}
	var queue api.RunList
	f.want(http.StatusOK, &queue, "GET", "/v1/runs?queue=1&project=vision", nil)
	var order []string
	for _, r := range queue.Runs {
		order = append(order, r.ID)
	}
	if want := []string{ids[2], ids[0], ids[1]}; !slices.Equal(order, want) {
		t.Errorf("vision's queue = %v, want %v", order, want)
	}
}

// TestLabelsConstraintsAndPools: an operator labels a node; a project
// restricted to a pool runs only there; a run constrained to a label no
// node has waits saying so; one asking for a pool outside its project's
// never runs.
func TestLabelsConstraintsAndPools(t *testing.T) {
	f := newRunsFixture(t)
	f.putNode("n1", 64<<30, 0)
	f.putNode("n2", 64<<30, 0)
	var node api.Node
	f.want(http.StatusOK, nil, "POST", "/v1/nodes/n2/labels", api.NodeLabelsRequest{Set: map[string]string{"pool": "secure", "zone": "b"}})
	f.want(http.StatusOK, &node, "POST", "/v1/nodes/n2/labels", api.NodeLabelsRequest{Remove: []string{"zone"}})
	if len(node.Labels) != 1 || node.Labels["pool"] != "secure" {
		t.Fatalf("labels = %v", node.Labels)
	}
	f.refusedAs(http.StatusBadRequest, "set", "letters", "POST", "/v1/nodes/n2/labels", api.NodeLabelsRequest{Set: map[string]string{"pool": "a b"}})
	f.want(http.StatusCreated, nil, "POST", "/v1/projects", api.Project{Name: "secure-team", Pools: []string{"secure"}})
	spec := api.RunSpec{Image: "127.0.0.1:5000/hello:1", Command: []string{"/hello"}, CPU: 1, Project: "secure-team"}
	var inPool, elsewhere, nowhere api.Run
	f.want(http.StatusCreated, &inPool, "POST", "/v1/runs", spec)
	spec.Constraints = map[string]string{"pool": "gpu"}
	f.want(http.StatusCreated, &elsewhere, "POST", "/v1/runs", spec)
	f.want(http.StatusCreated, &nowhere, "POST", "/v1/runs", api.RunSpec{Image: spec.Image, Command: spec.Command, Constraints: map[string]string{"zone": "x"}})
	if err := f.srv.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got api.Run
	f.want(http.StatusOK, &got, "GET", "/v1/runs/"+inPool.ID, nil)
	if len(got.Attempts) != 1 || got.Attempts[0].NodeID != "n2" {
		t.Errorf("the pool's run: %s %q %+v, want placed on n2", got.Status, got.Reason, got.Attempts)
	}
	f.want(http.StatusOK, &got, "GET", "/v1/runs/"+elsewhere.ID, nil)
	if got.Status != api.RunQueued || !strings.Contains(got.Reason, "2 nodes have no label pool=gpu (outside the project's pools)") {
		t.Errorf("a run outside its project's pools: %s %q", got.Status, got.Reason)
	}
	f.want(http.StatusOK, &got, "GET", "/v1/runs/"+nowhere.ID, nil)
	if got.Status != api.RunQueued || got.Reason != "waiting: 2 nodes have no label zone=x" {
		t.Errorf("a run no node matches: %s %q", got.Status, got.Reason)
	}
}

// TestProjectScopedToken: an operator token confined to vision submits
// there by default and nowhere else, lists and reads only vision's runs
// and projects, and may not change projects; an admin token cannot be
// confined, nor a token to a project that does not exist.
func TestProjectScopedToken(t *testing.T) {
	f := newRunsFixture(t)
	for _, name := range []string{"vision", "nlp"} {
		f.want(http.StatusCreated, nil, "POST", "/v1/projects", api.Project{Name: name})
	}
	f.refusedAs(http.StatusBadRequest, "projects", "admin", "POST", "/v1/tokens", api.TokenRequest{Name: "a", Role: "admin", Projects: []string{"vision"}})
	f.refusedAs(http.StatusBadRequest, "projects", "does not exist", "POST", "/v1/tokens", api.TokenRequest{Name: "x", Role: "submitter", Projects: []string{"cv"}})
	var created api.TokenCreated
	f.want(http.StatusCreated, &created, "POST", "/v1/tokens", api.TokenRequest{Name: "vision-ops", Role: "operator", Projects: []string{"vision"}})
	var other api.Run
	f.want(http.StatusCreated, &other, "POST", "/v1/runs", api.RunSpec{Image: "127.0.0.1:5000/hello:1", Command: []string{"/hello"}, Project: "nlp"})

	admin := f.token
	f.token = created.Secret
	defer func() { f.token = admin }()
	var mine api.Run
	f.want(http.StatusCreated, &mine, "POST", "/v1/runs", api.RunSpec{Image: "127.0.0.1:5000/hello:1", Command: []string{"/hello"}})
	if mine.Project != "vision" {
		t.Errorf("a confined token's run went to %q, want its project", mine.Project)
	}
	f.refusedAs(http.StatusForbidden, "", "confined to project(s) vision", "POST", "/v1/runs",
		api.RunSpec{Image: "127.0.0.1:5000/hello:1", Command: []string{"/hello"}, Project: "nlp"})
	f.refusedAs(http.StatusForbidden, "", "may not read runs", "GET", "/v1/runs/"+other.ID, nil)
	f.refusedAs(http.StatusForbidden, "", "may not cancel runs", "POST", "/v1/runs/"+other.ID+"/cancel", nil)
	f.want(http.StatusOK, nil, "GET", "/v1/runs/"+mine.ID, nil)
	var runs api.RunList
	f.want(http.StatusOK, &runs, "GET", "/v1/runs", nil)
	if len(runs.Runs) != 1 || runs.Runs[0].ID != mine.ID {
		t.Errorf("a confined token lists %+v, want only its run", runs.Runs)
	}
	f.refusedAs(http.StatusForbidden, "", "may not list runs", "GET", "/v1/runs?project=nlp", nil)
	var projects api.ProjectList
	f.want(http.StatusOK, &projects, "GET", "/v1/projects", nil)
	if names := projectNames(projects); !slices.Equal(names, []string{"vision"}) {
		t.Errorf("a confined token sees projects %v", names)
	}
	f.refusedAs(http.StatusForbidden, "", "confined to projects", "PUT", "/v1/projects/vision", api.Project{Quota: api.Quota{CPU: 1000}})
}

// TestAgentLabelsUnderOperatorLabels: the labels an agent reports with its
// facts are the node's, and an operator's label of the same key wins.
func TestAgentLabelsUnderOperatorLabels(t *testing.T) {
	f := newRunsFixture(t)
	now := time.Now()
	if err := f.srv.update(context.Background(), func(tx store.Tx) error {
		return tx.PutNode(store.Node{ID: "n1", CreatedAt: now, EnrolledAt: &now, LastSeenAt: &now,
			Facts: &nodeproto.NodeFacts{CPUs: 16, MemoryBytes: 64 << 30, Labels: map[string]string{"pool": "gpu", "zone": "a"}}})
	}); err != nil {
		t.Fatal(err)
	}
	var node api.Node
	f.want(http.StatusOK, &node, "POST", "/v1/nodes/n1/labels", api.NodeLabelsRequest{Set: map[string]string{"zone": "b"}})
	if len(node.Labels) != 2 || node.Labels["pool"] != "gpu" || node.Labels["zone"] != "b" {
		t.Errorf("labels = %v, want the agent's pool and the operator's zone", node.Labels)
	}
}

// TestAppsBelongToAProject: an app is created in an existing project (the
// default one when it names none), and keeps it.
func TestAppsBelongToAProject(t *testing.T) {
	f := newRunsFixture(t)
	f.want(http.StatusCreated, nil, "POST", "/v1/projects", api.Project{Name: "nlp"})
	var app api.App
	f.want(http.StatusOK, &app, "POST", "/v2/apps", api.App{Name: "plain"})
	if app.Project != api.DefaultProject {
		t.Errorf("an app naming no project is in %q", app.Project)
	}
	f.want(http.StatusOK, &app, "POST", "/v2/apps", api.App{Name: "tagger", Project: "nlp"})
	if app.Project != "nlp" {
		t.Errorf("app project = %q", app.Project)
	}
	if status, _, body := f.do("POST", "/v2/apps", api.App{Name: "x", Project: "cv"}); status != http.StatusBadRequest || !strings.Contains(string(body), "does not exist") {
		t.Errorf("an app in a missing project: %d %s", status, body)
	}
	if status, _, body := f.do("PUT", "/v2/apps/"+app.ID, api.App{Project: "default"}); status != http.StatusBadRequest || !strings.Contains(string(body), "set when it is created") {
		t.Errorf("moving an app: %d %s", status, body)
	}
}

// TestFunctionContainersCountAgainstTheProject: the containers of an app's
// functions, as nodes report them, count against the app's project: with
// them the project is at its CPU quota, and its run waits saying so.
func TestFunctionContainersCountAgainstTheProject(t *testing.T) {
	f := newRunsFixture(t)
	f.want(http.StatusCreated, nil, "POST", "/v1/projects", api.Project{Name: "nlp", Quota: api.Quota{CPU: 2, MemoryBytes: 1 << 30}})
	var app api.App
	f.want(http.StatusOK, &app, "POST", "/v2/apps", api.App{Name: "tagger", Project: "nlp"})
	var fn api.Fn
	f.want(http.StatusOK, &fn, "POST", "/v2/fns", api.Fn{Name: "tag", AppID: app.ID, Image: "registry.local/f:1", CPU: 1})
	now := time.Now()
	if err := f.srv.update(context.Background(), func(tx store.Tx) error {
		return tx.PutNode(store.Node{ID: "n1", CreatedAt: now, EnrolledAt: &now, LastSeenAt: &now,
			Facts: &nodeproto.NodeFacts{CPUs: 2, MemoryBytes: 8 << 30, Functions: &nodeproto.FunctionCapacity{MilliCPUs: 2000, MemoryBytes: 1 << 30,
				Containers: []nodeproto.FunctionContainers{{FnID: fn.ID, Busy: 1, Idle: 1}}}}})
	}); err != nil {
		t.Fatal(err)
	}
	var run api.Run
	f.want(http.StatusCreated, &run, "POST", "/v1/runs", api.RunSpec{Image: "127.0.0.1:5000/hello:1", Command: []string{"/hello"}, CPU: 1, Project: "nlp"})
	if err := f.srv.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.want(http.StatusOK, &run, "GET", "/v1/runs/"+run.ID, nil)
	if want := "waiting: project nlp is at its quota of 2 CPUs (2 in use, 0 borrowable)"; run.Reason != want {
		t.Errorf("reason %q, want %q", run.Reason, want)
	}
}
