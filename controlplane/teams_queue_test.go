package controlplane

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// TestQueueInterleavedAcrossProjects: with the fleet full, the queue of two
// projects lists interleaved, as the scheduler's fair share would take
// their runs (scheduler.Plan.Order), not one project's after the other's;
// each run's position is still its place in its own project's queue.
func TestQueueInterleavedAcrossProjects(t *testing.T) {
	f := newRunsFixture(t)
	f.addNodes(1) // 16 CPUs
	for _, name := range []string{"a", "b", "other"} {
		f.want(http.StatusCreated, nil, "POST", "/v1/projects", api.Project{Name: name})
	}
	submit := func(project string, cpu float64) string {
		var r api.Run
		f.want(http.StatusCreated, &r, "POST", "/v1/runs", api.RunSpec{Image: "127.0.0.1:5000/hello:1", Command: []string{"/hello"}, Project: project, CPU: cpu})
		return r.ID
	}
	submit("other", 16)
	if err := f.srv.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	var a, b []string
	for range 3 {
		a = append(a, submit("a", 4))
	}
	for range 3 {
		b = append(b, submit("b", 4))
	}
	if err := f.srv.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	var queue api.RunList
	f.want(http.StatusOK, &queue, "GET", "/v1/runs?queue=1", nil)
	var order []string
	for _, r := range queue.Runs {
		order = append(order, r.ID)
	}
	if want := []string{a[0], b[0], a[1], b[1], a[2], b[2]}; !slices.Equal(order, want) {
		t.Errorf("queue = %v\nwant    %v (a's and b's interleaved)", order, want)
	}
	var got api.Run
	f.want(http.StatusOK, &got, "GET", "/v1/runs/"+b[1], nil)
	if q := got.Queue; q == nil || q.Project != "b" || q.Position != 2 || q.Of != 3 || !slices.Equal(q.Ahead, []string{b[0]}) {
		t.Errorf("b's second run: %+v", got.Queue)
	}
}

// TestProjectShowsFunctionReservations: GET /v1/projects/{name} shows, by
// node, what its functions' containers hold there, and only its own.
func TestProjectShowsFunctionReservations(t *testing.T) {
	f := newRunsFixture(t)
	for _, name := range []string{"nlp", "vision"} {
		f.want(http.StatusCreated, nil, "POST", "/v1/projects", api.Project{Name: name})
	}
	fnIn := func(project string, cpu float64, memMB uint64) string {
		var app api.App
		f.want(http.StatusOK, &app, "POST", "/v2/apps", api.App{Name: project + "-app", Project: project})
		var fn api.Fn
		f.want(http.StatusOK, &fn, "POST", "/v2/fns", api.Fn{Name: "f", AppID: app.ID, Image: "registry.local/f:1", CPU: cpu, Memory: memMB})
		return fn.ID
	}
	tag, detect := fnIn("nlp", 0.5, 256), fnIn("vision", 2, 1024)
	now := time.Now()
	containers := map[string][]nodeproto.FunctionContainers{
		"n1": {{FnID: tag, Busy: 1, Idle: 2, Paused: 1}, {FnID: detect, Busy: 1}},
		"n2": {{FnID: detect, Starting: 1}},
		"n3": {{FnID: tag, Starting: 1}},
		"n4": nil,
	}
	if err := f.srv.update(context.Background(), func(tx store.Tx) error {
		for id, cs := range containers {
			err := tx.PutNode(store.Node{ID: id, CreatedAt: now, EnrolledAt: &now, LastSeenAt: &now,
				Facts: &nodeproto.NodeFacts{CPUs: 8, MemoryBytes: 8 << 30, Functions: &nodeproto.FunctionCapacity{MilliCPUs: 4000, MemoryBytes: 4 << 30, Containers: cs}}})
			if err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var got api.Project
	f.want(http.StatusOK, &got, "GET", "/v1/projects/nlp", nil)
	want := []api.FunctionReservation{{Node: "n1", Containers: 3, CPU: 1.5, MemoryBytes: 3 * 256 << 20}, {Node: "n3", Containers: 1, CPU: 0.5, MemoryBytes: 256 << 20}}
	if !slices.Equal(got.FunctionReservations, want) {
		t.Errorf("nlp's reservations = %+v\nwant %+v", got.FunctionReservations, want)
	}
	var list api.ProjectList
	f.want(http.StatusOK, &list, "GET", "/v1/projects", nil)
	for _, p := range list.Projects {
		if len(p.FunctionReservations) > 0 {
			t.Errorf("the listing shows %s's reservations", p.Name)
		}
	}
}
