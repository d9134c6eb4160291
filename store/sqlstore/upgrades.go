package sqlstore

import (
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// Agent releases and rollouts (schema version 7).

var upgradesMigration = []string{
	`CREATE TABLE agent_releases (
		version TEXT NOT NULL,
		platform TEXT NOT NULL,
		doc TEXT NOT NULL,
		PRIMARY KEY (version, platform)
	)`,
	`CREATE TABLE rollouts (
		id TEXT PRIMARY KEY,
		created_sec BIGINT NOT NULL,
		created_nsec BIGINT NOT NULL,
		doc TEXT NOT NULL
	)`,
	`CREATE INDEX rollouts_by_created ON rollouts (created_sec, created_nsec, id)`,
}

func (t *txn) CreateAgentRelease(r store.AgentRelease) error {
	if err := record.AgentRelease(r); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	key := r.Version + " " + r.Platform
	doc, err := encode("agent release", key, r)
	if err != nil {
		return err
	}
	return t.create("agent release", key,
		`INSERT INTO agent_releases (version, platform, doc) VALUES ($1, $2, $3) ON CONFLICT (version, platform) DO NOTHING`,
		r.Version, r.Platform, doc)
}

func (t *txn) GetAgentRelease(version, platform string) (store.AgentRelease, error) {
	return getDoc[store.AgentRelease](t, "agent release", version+" "+platform,
		`SELECT doc FROM agent_releases WHERE version = $1 AND platform = $2`, version, platform)
}

func (t *txn) ListAgentReleases() ([]store.AgentRelease, error) {
	return listDocs[store.AgentRelease](t, "agent release",
		`SELECT version, doc FROM agent_releases ORDER BY version, platform`)
}

func (t *txn) DeleteAgentRelease(version, platform string) error {
	return t.deleteOne("agent release", version+" "+platform,
		`DELETE FROM agent_releases WHERE version = $1 AND platform = $2`, version, platform)
}

func (t *txn) PutRollout(r store.Rollout) error {
	if err := record.Rollout(r); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("rollout", r.ID, r)
	if err != nil {
		return err
	}
	_, err = t.exec("put", "rollout", r.ID,
		`INSERT INTO rollouts (id, created_sec, created_nsec, doc) VALUES ($1, $2, $3, $4)
		 ON CONFLICT (id) DO UPDATE SET doc = excluded.doc`,
		r.ID, r.CreatedAt.Unix(), int64(r.CreatedAt.Nanosecond()), doc)
	return err
}

func (t *txn) GetRollout(id string) (store.Rollout, error) {
	return getDoc[store.Rollout](t, "rollout", id, `SELECT doc FROM rollouts WHERE id = $1`, id)
}

func (t *txn) ListRollouts() ([]store.Rollout, error) {
	return listDocs[store.Rollout](t, "rollout",
		`SELECT id, doc FROM rollouts ORDER BY created_sec DESC, created_nsec DESC, id DESC`)
}

func (t *txn) DeleteRollout(id string) error {
	return t.deleteOne("rollout", id, `DELETE FROM rollouts WHERE id = $1`, id)
}

// deleteOne runs a DELETE of one record; ErrNotFound if it deleted nothing.
func (t *txn) deleteOne(what, id, query string, args ...any) error {
	if err := t.writable(); err != nil {
		return err
	}
	if _, bad := t.unstorable(args); bad {
		return failure.NotFound(what, id)
	}
	n, err := t.affected("delete", what, id, query, args...)
	if err != nil {
		return err
	}
	if n == 0 {
		return failure.NotFound(what, id)
	}
	return nil
}
