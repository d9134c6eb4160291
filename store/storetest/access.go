package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// testTokenLifecycle: a token's last use is replaced in place, tokens list
// by name, and a deleted token is gone for good (a late PutToken does not
// bring it back).
func testTokenLifecycle(t *testing.T, s store.Store) {
	reader := store.Token{Hash: "h-r", Name: "ci", Role: "reader", CreatedAt: at(0), ExpiresAt: ptr(at(time.Hour))}
	invoker := store.Token{Hash: "h-i", Name: "bot", Role: "invoker", App: "demo", CreatedAt: at(time.Second)}
	update(t, s, func(tx store.Tx) error {
		wantKind(t, tx.PutToken(reader), failure.ErrNotFound, "h-r")
		must(t, tx.CreateToken(reader))
		must(t, tx.CreateToken(invoker))
		return nil
	})
	used := reader
	used.LastUsedAt = ptr(at(time.Minute))
	update(t, s, func(tx store.Tx) error { return tx.PutToken(used) })
	view(t, s, func(tx store.Tx) error {
		same(t, "ListTokens", must1[[]store.Token](t)(tx.ListTokens()), []store.Token{invoker, used})
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		must(t, tx.DeleteToken("h-r"))
		wantKind(t, tx.DeleteToken("h-r"), failure.ErrNotFound, "h-r")
		wantKind(t, tx.PutToken(used), failure.ErrNotFound, "h-r")
		_, err := tx.GetToken("h-r")
		wantKind(t, err, failure.ErrNotFound, "h-r")
		return nil
	})
}

// testInvitationList: a node's invitations list oldest first, only its
// own, and a deleted one is gone.
func testInvitationList(t *testing.T, s store.Store) {
	old, newer, other := sampleInvitation("inv-old", "node-l"), sampleInvitation("inv-new", "node-l"), sampleInvitation("inv-other", "node-m")
	newer.CreatedAt = at(time.Minute)
	update(t, s, func(tx store.Tx) error {
		same(t, "ListInvitations of none", must1[[]store.Invitation](t)(tx.ListInvitations("node-l")), []store.Invitation{})
		for _, inv := range []store.Invitation{newer, other, old} {
			must(t, tx.CreateInvitation(inv))
		}
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "ListInvitations", must1[[]store.Invitation](t)(tx.ListInvitations("node-l")), []store.Invitation{old, newer})
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		must(t, tx.DeleteInvitation("inv-old"))
		wantKind(t, tx.DeleteInvitation("inv-old"), failure.ErrNotFound, "inv-old")
		same(t, "ListInvitations after delete", must1[[]store.Invitation](t)(tx.ListInvitations("node-l")), []store.Invitation{newer})
		return nil
	})
}

func auditEntry(i int, who string) store.AuditEntry {
	return store.AuditEntry{ID: fmt.Sprintf("aud-%03d", i), At: at(time.Duration(i) * time.Minute), Who: who, Role: "admin",
		Remote: "127.0.0.1:5000", Method: "POST", Route: "POST /v1/runs", Object: "run-x", Status: 201}
}

// testAudit: entries list newest first, filtered by time and who, and the
// retention rule (age, then a row cap) prunes the oldest.
func testAudit(t *testing.T, s store.Store) {
	var all []store.AuditEntry
	for i := range 10 {
		all = append(all, auditEntry(i, []string{"alice", "bob"}[i%2]))
	}
	update(t, s, func(tx store.Tx) error {
		must(t, tx.AppendAudit(all[:5]))
		must(t, tx.AppendAudit(all[5:]))
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		wantKind(t, tx.AppendAudit(all[:1]), failure.ErrConflict, "aud-000")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		got := must1[[]store.AuditEntry](t)(tx.ListAudit(store.ListAuditOptions{}))
		same(t, "ListAudit", got, reversed(all))
		got = must1[[]store.AuditEntry](t)(tx.ListAudit(store.ListAuditOptions{Since: at(6 * time.Minute), Who: "bob", Limit: 1}))
		same(t, "ListAudit since, who, limit", got, []store.AuditEntry{all[9]})
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		n := must1[int](t)(tx.PruneAudit(at(2*time.Minute), 0))
		if n != 2 {
			t.Errorf("PruneAudit by age deleted %d, want 2", n)
		}
		n = must1[int](t)(tx.PruneAudit(at(0), 3))
		if n != 5 {
			t.Errorf("PruneAudit by cap deleted %d, want 5", n)
		}
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "ListAudit after pruning", must1[[]store.AuditEntry](t)(tx.ListAudit(store.ListAuditOptions{})), reversed(all[7:]))
		return nil
	})
}

func reversed[T any](xs []T) []T {
	out := make([]T, 0, len(xs))
	for i := len(xs) - 1; i >= 0; i-- {
		out = append(out, xs[i])
	}
	return out
}
