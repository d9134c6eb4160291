package storetest

import (
	"testing"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

func sampleRelease(version, platform string) store.AgentRelease {
	return store.AgentRelease{Version: version, Platform: platform, SHA256: "ab" + version, Size: 1234,
		Signature: []byte{1, 2, 3}, CreatedAt: time.Date(2026, 12, 1, 10, 0, 0, 5, time.UTC)}
}

// testAgentReleases: created once per version and platform, listed by
// version then platform, the signature's bytes back exactly, deleted once.
func testAgentReleases(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetAgentRelease("v2", "linux/amd64")
		wantKind(t, err, failure.ErrNotFound, "v2")
		wantKind(t, tx.DeleteAgentRelease("v2", "linux/amd64"), failure.ErrNotFound, "v2")
		for _, r := range []store.AgentRelease{sampleRelease("v2", "linux/arm64"), sampleRelease("v1", "linux/amd64"), sampleRelease("v2", "linux/amd64")} {
			must(t, tx.CreateAgentRelease(r))
		}
		wantKind(t, tx.CreateAgentRelease(sampleRelease("v1", "linux/amd64")), failure.ErrConflict, "v1")
		wantKind(t, tx.CreateAgentRelease(store.AgentRelease{Platform: "linux/amd64"}), failure.ErrInvalid, "version")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "GetAgentRelease", must1[store.AgentRelease](t)(tx.GetAgentRelease("v2", "linux/arm64")), sampleRelease("v2", "linux/arm64"))
		got := must1[[]store.AgentRelease](t)(tx.ListAgentReleases())
		wantIDs(t, "ListAgentReleases", ids(got, func(r store.AgentRelease) string { return r.Version + " " + r.Platform }),
			[]string{"v1 linux/amd64", "v2 linux/amd64", "v2 linux/arm64"})
		return nil
	})
	update(t, s, func(tx store.Tx) error { return tx.DeleteAgentRelease("v1", "linux/amd64") })
	view(t, s, func(tx store.Tx) error {
		got := must1[[]store.AgentRelease](t)(tx.ListAgentReleases())
		wantIDs(t, "after delete", ids(got, func(r store.AgentRelease) string { return r.Version + " " + r.Platform }),
			[]string{"v2 linux/amd64", "v2 linux/arm64"})
		return nil
	})
}

// testRollouts: upserted by ID, listed newest first, deleted once.
func testRollouts(t *testing.T, s store.Store) {
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	sent := base.Add(time.Second)
	ro := func(id string, at time.Time) store.Rollout {
		return store.Rollout{ID: id, Version: "v2", Platform: "linux/amd64", Canary: 1, MaxParallel: 2, Deadline: time.Minute,
			State: store.RolloutRunning, CreatedAt: at, UpdatedAt: at,
			Nodes: []store.RolloutNode{{ID: "n1", State: store.RolloutNodeSent, OperationID: "op-1", SentAt: &sent}, {ID: "n2", State: store.RolloutNodePending}}}
	}
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetRollout("r1")
		wantKind(t, err, failure.ErrNotFound, "r1")
		wantKind(t, tx.PutRollout(store.Rollout{}), failure.ErrInvalid, "id")
		must(t, tx.PutRollout(ro("r1", base)))
		must(t, tx.PutRollout(ro("r3", base.Add(2*time.Minute))))
		must(t, tx.PutRollout(ro("r2", base.Add(time.Minute))))
		return nil
	})
	done := ro("r1", base)
	done.State, done.Reason = store.RolloutStopped, "n1: rolled back"
	done.Nodes[0].State, done.Nodes[0].Error = store.RolloutNodeFailed, "rolled back"
	update(t, s, func(tx store.Tx) error { return tx.PutRollout(done) })
	view(t, s, func(tx store.Tx) error {
		same(t, "GetRollout", must1[store.Rollout](t)(tx.GetRollout("r1")), done)
		got := must1[[]store.Rollout](t)(tx.ListRollouts())
		wantIDs(t, "ListRollouts", ids(got, func(r store.Rollout) string { return r.ID }), []string{"r3", "r2", "r1"})
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		must(t, tx.DeleteRollout("r2"))
		wantKind(t, tx.DeleteRollout("r2"), failure.ErrNotFound, "r2")
		return nil
	})
}
