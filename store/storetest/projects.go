package storetest

import (
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

func sampleProject(name string) store.Project {
	return store.Project{Project: api.Project{Name: name,
		Quota:      api.Quota{GPUs: map[string]int{"H100": 16, "A100": 8}, CPU: 256, MemoryBytes: 2 << 40},
		MaxRunning: 40, Weight: 2, Pools: []string{"secure"}, CreatedAt: at(0), UpdatedAt: at(0)}}
}

// testProjects: create once, replace in place, list by name, delete once;
// a late Put does not bring a deleted project back.
func testProjects(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetProject("vision")
		wantKind(t, err, failure.ErrNotFound, "vision")
		wantKind(t, tx.PutProject(sampleProject("vision")), failure.ErrNotFound, "vision")
		for _, n := range []string{"vision", "nlp", "default"} {
			must(t, tx.CreateProject(sampleProject(n)))
		}
		wantKind(t, tx.CreateProject(sampleProject("nlp")), failure.ErrConflict, "nlp")
		return nil
	})
	changed := sampleProject("vision")
	changed.Quota.GPUs = map[string]int{"H100": 32}
	changed.Pools, changed.UpdatedAt = nil, at(time.Minute)
	update(t, s, func(tx store.Tx) error { return tx.PutProject(changed) })
	view(t, s, func(tx store.Tx) error {
		same(t, "GetProject", must1[store.Project](t)(tx.GetProject("vision")), changed)
		got := must1[[]store.Project](t)(tx.ListProjects())
		wantIDs(t, "ListProjects", ids(got, func(p store.Project) string { return p.Name }), []string{"default", "nlp", "vision"})
		same(t, "listed nlp", got[1], sampleProject("nlp"))
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		must(t, tx.DeleteProject("nlp"))
		wantKind(t, tx.DeleteProject("nlp"), failure.ErrNotFound, "nlp")
		wantKind(t, tx.PutProject(sampleProject("nlp")), failure.ErrNotFound, "nlp")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		got := must1[[]store.Project](t)(tx.ListProjects())
		wantIDs(t, "after delete", ids(got, func(p store.Project) string { return p.Name }), []string{"default", "vision"})
		return nil
	})
}

// testListRunsByProject: the project filter sees a run's project as it is
// now (a Put that moves it moves it in the list), and a run without one
// is in the default project.
func testListRunsByProject(t *testing.T, s store.Store) {
	plain := sampleRun("r-plain", at(0), api.RunQueued)
	vision := sampleRun("r-vision", at(time.Second), api.RunQueued)
	vision.Project = "vision"
	moved := sampleRun("r-moved", at(2*time.Second), api.RunRunning)
	moved.Project = "vision"
	update(t, s, func(tx store.Tx) error {
		for _, r := range []store.Run{plain, vision, moved} {
			must(t, tx.CreateRun(r))
		}
		return nil
	})
	moved.Project = "nlp"
	update(t, s, func(tx store.Tx) error { return tx.PutRun(moved) })
	view(t, s, func(tx store.Tx) error {
		list := func(o store.ListRunsOptions) []string {
			return ids(must1[[]store.Run](t)(tx.ListRuns(o)), func(r store.Run) string { return r.ID })
		}
		wantIDs(t, "Project vision", list(store.ListRunsOptions{Project: "vision"}), []string{"r-vision"})
		wantIDs(t, "Project nlp", list(store.ListRunsOptions{Project: "nlp"}), []string{"r-moved"})
		wantIDs(t, "Project default", list(store.ListRunsOptions{Project: api.DefaultProject}), []string{"r-plain"})
		wantIDs(t, "Project vision, running", list(store.ListRunsOptions{Project: "vision", Statuses: []string{api.RunRunning}}), nil)
		return nil
	})
}
