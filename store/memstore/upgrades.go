package memstore

import (
	"cmp"
	"errors"
	"slices"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// Agent releases and rollouts (store.UpgradeTx).

func (t *tx) CreateAgentRelease(r store.AgentRelease) error {
	if err := record.AgentRelease(r); err != nil {
		return err
	}
	return put(t, "releases", &t.st.releases, "agent release", record.AgentReleaseKey(r.Version, r.Platform), r, create)
}

func (t *tx) GetAgentRelease(version, platform string) (store.AgentRelease, error) {
	r, err := get[store.AgentRelease](t, t.st.releases, "agent release", record.AgentReleaseKey(version, platform))
	if errors.Is(err, failure.ErrNotFound) {
		return r, failure.NotFound("agent release", version+" "+platform)
	}
	return r, err
}

func (t *tx) ListAgentReleases() ([]store.AgentRelease, error) {
	out, err := list(t, t.st.releases, "agent release", func(store.AgentRelease) bool { return true })
	slices.SortFunc(out, func(a, b store.AgentRelease) int {
		return cmp.Or(cmp.Compare(a.Version, b.Version), cmp.Compare(a.Platform, b.Platform))
	})
	return out, err
}

func (t *tx) DeleteAgentRelease(version, platform string) error {
	return del(t, "releases", &t.st.releases, "agent release", record.AgentReleaseKey(version, platform))
}

func (t *tx) PutRollout(r store.Rollout) error {
	if err := record.Rollout(r); err != nil {
		return err
	}
	return put(t, "rollouts", &t.st.rollouts, "rollout", r.ID, r, upsert)
}

func (t *tx) GetRollout(id string) (store.Rollout, error) {
	return get[store.Rollout](t, t.st.rollouts, "rollout", id)
}

func (t *tx) ListRollouts() ([]store.Rollout, error) {
	out, err := list(t, t.st.rollouts, "rollout", func(store.Rollout) bool { return true })
	slices.SortFunc(out, func(a, b store.Rollout) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), cmp.Compare(b.ID, a.ID))
	})
	return out, err
}

func (t *tx) DeleteRollout(id string) error {
	return del(t, "rollouts", &t.st.rollouts, "rollout", id)
}

// del removes a record; ErrNotFound if there is none.
func del(t *tx, name string, m *map[string][]byte, what, id string) error {
	if err := t.writable(); err != nil {
		return err
	}
	if _, ok := (*m)[id]; !ok {
		return failure.NotFound(what, id)
	}
	delete(table(t, name, m), id)
	return nil
}
