package sqlstore

import (
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// projectsMigration adds projects (a document per name) and the runs'
// project column, which ListRunsOptions.Project filters on; a run stored
// before projects existed is in the default project.
var projectsMigration = []string{
	`CREATE TABLE projects (
		name TEXT PRIMARY KEY,
		doc TEXT NOT NULL
	)`,
	`ALTER TABLE runs ADD COLUMN project TEXT NOT NULL DEFAULT 'default'`,
	`CREATE INDEX runs_by_project ON runs (project, created_sec, created_nsec, id)`,
}

func (t *txn) CreateProject(p store.Project) error {
	if err := record.Project(p); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("project", p.Name, p)
	if err != nil {
		return err
	}
	return t.create("project", p.Name,
		`INSERT INTO projects (name, doc) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, p.Name, doc)
}

func (t *txn) GetProject(name string) (store.Project, error) {
	return getDoc[store.Project](t, "project", name, `SELECT doc FROM projects WHERE name = $1`, name)
}

func (t *txn) PutProject(p store.Project) error {
	if err := record.Project(p); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("project", p.Name, p)
	if err != nil {
		return err
	}
	return t.replace("project", p.Name, `UPDATE projects SET doc = $2 WHERE name = $1`, p.Name, doc)
}

func (t *txn) ListProjects() ([]store.Project, error) {
	return listDocs[store.Project](t, "project", `SELECT name, doc FROM projects ORDER BY name`)
}

func (t *txn) DeleteProject(name string) error {
	return t.deleteByKey("projects", "name", "project", name)
}
