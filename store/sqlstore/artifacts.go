package sqlstore

import (
	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// The Artifact catalog and the registry credentials (schema version 2;
// credentials by project since 10).

// registryProjectsMigration keys registry credentials by project and host
// (docs/teams.md: a project's runs pull with its own credential, and two
// projects may hold one each for the same host). A credential stored
// before is the default project's. An Artifact's project is a field of its
// document (absent: the default project), filtered in the control plane,
// so the catalog's table is unchanged.
var registryProjectsMigration = []string{
	`CREATE TABLE registry_credentials_v10 (
		project TEXT NOT NULL,
		host TEXT NOT NULL,
		doc TEXT NOT NULL,
		PRIMARY KEY (project, host)
	)`,
	`INSERT INTO registry_credentials_v10 (project, host, doc) SELECT 'default', host, doc FROM registry_credentials`,
	`DROP TABLE registry_credentials`,
	`ALTER TABLE registry_credentials_v10 RENAME TO registry_credentials`,
}

func (t *txn) CreateArtifact(a store.Artifact) error {
	if err := record.Artifact(a); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	ref := a.Name + "@" + a.Version
	doc, err := encode("artifact", ref, a)
	if err != nil {
		return err
	}
	return t.create("artifact", ref,
		`INSERT INTO artifacts (name, version, seq, doc) VALUES ($1, $2, $3, $4) ON CONFLICT (name, version) DO NOTHING`,
		a.Name, a.Version, a.Seq, doc)
}

func (t *txn) GetArtifact(name, version string) (store.Artifact, error) {
	return getDoc[store.Artifact](t, "artifact", name+"@"+version,
		`SELECT doc FROM artifacts WHERE name = $1 AND version = $2`, name, version)
}

func (t *txn) ListArtifacts(name string) ([]store.Artifact, error) {
	if name == "" {
		return listDocs[store.Artifact](t, "artifact", `SELECT version, doc FROM artifacts ORDER BY name, seq, version`)
	}
	return listDocs[store.Artifact](t, "artifact",
		`SELECT version, doc FROM artifacts WHERE name = $1 ORDER BY seq, version`, name)
}

func (t *txn) PutRegistryCredential(c store.RegistryCredential) error {
	if err := record.RegistryCredential(c); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	project := api.ProjectOf(c.Project)
	doc, err := encode("registry credential", c.Host, c)
	if err != nil {
		return err
	}
	_, err = t.exec("put", "registry credential", c.Host,
		`INSERT INTO registry_credentials (project, host, doc) VALUES ($1, $2, $3) ON CONFLICT (project, host) DO UPDATE SET doc = excluded.doc`,
		project, c.Host, doc)
	return err
}

func (t *txn) GetRegistryCredential(project, host string) (store.RegistryCredential, error) {
	return getDoc[store.RegistryCredential](t, "registry credential", host,
		`SELECT doc FROM registry_credentials WHERE project = $1 AND host = $2`, api.ProjectOf(project), host)
}

func (t *txn) ListRegistryCredentials() ([]store.RegistryCredential, error) {
	return listDocs[store.RegistryCredential](t, "registry credential",
		`SELECT host, doc FROM registry_credentials ORDER BY project, host`)
}

func (t *txn) DeleteRegistryCredential(project, host string) error {
	if err := t.writable(); err != nil {
		return err
	}
	project = api.ProjectOf(project)
	if _, bad := t.unstorable([]any{project, host}); bad {
		return failure.NotFound("registry credential", host)
	}
	n, err := t.affected("delete", "registry credential", host, `DELETE FROM registry_credentials WHERE project = $1 AND host = $2`, project, host)
	if err != nil {
		return err
	}
	if n == 0 {
		return failure.NotFound("registry credential", host)
	}
	return nil
}
