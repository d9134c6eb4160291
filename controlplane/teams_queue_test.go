package controlplane

import (
	"context"
	"net/http"
	"slices"
	"testing"

	"github.com/mercator/mercator/api"
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
