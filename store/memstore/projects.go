package memstore

import (
	"cmp"
	"slices"

	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

func (t *tx) CreateProject(p store.Project) error {
	if err := record.Project(p); err != nil {
		return err
	}
	return put(t, "projects", &t.st.projects, "project", p.Name, p, create)
}

func (t *tx) GetProject(name string) (store.Project, error) {
	return get[store.Project](t, t.st.projects, "project", name)
}

func (t *tx) PutProject(p store.Project) error {
	if err := record.Project(p); err != nil {
		return err
	}
	return put(t, "projects", &t.st.projects, "project", p.Name, p, replace)
}

func (t *tx) ListProjects() ([]store.Project, error) {
	out, err := list(t, t.st.projects, "project", func(store.Project) bool { return true })
	slices.SortFunc(out, func(a, b store.Project) int { return cmp.Compare(a.Name, b.Name) })
	return out, err
}

func (t *tx) DeleteProject(name string) error {
	return remove(t, "projects", &t.st.projects, "project", name)
}
