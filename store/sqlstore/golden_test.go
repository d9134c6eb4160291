package sqlstore

import (
	"strconv"
	"testing"

	"github.com/mercator/mercator/store"
)

// documentTables maps a golden document's kind to the table that keeps it
// and that table's key columns, in the order storetest gives the key.
var documentTables = map[string]struct {
	table string
	key   []string
}{
	"node":                {"nodes", []string{"id"}},
	"invitation":          {"invitations", []string{"token_hash"}},
	"session":             {"sessions", []string{"token_hash"}},
	"run":                 {"runs", []string{"id"}},
	"operation":           {"operations", []string{"id"}},
	"token":               {"tokens", []string{"hash"}},
	"artifact":            {"artifacts", []string{"name", "version"}},
	"registry_credential": {"registry_credentials", []string{"project", "host"}},
	"app":                 {"fn_apps", []string{"id"}},
	"fn":                  {"fn_fns", []string{"id"}},
	"trigger":             {"fn_triggers", []string{"id"}},
	"call":                {"fn_calls", []string{"id"}},
	"project":             {"projects", []string{"name"}},
	"agent_release":       {"agent_releases", []string{"version", "platform"}},
	"rollout":             {"rollouts", []string{"id"}},
}

// writeDocument is storetest's DocumentWriter for sqlstore: it replaces
// the doc column of one row, so the golden documents are read through
// decode, as rows written by an earlier version are.
func writeDocument(t *testing.T, s store.Store, kind string, key []string, doc []byte) {
	t.Helper()
	dt, ok := documentTables[kind]
	if !ok || len(key) != len(dt.key) {
		t.Fatalf("sqlstore keeps no %s documents under a key of %d columns", kind, len(key))
	}
	query := "UPDATE " + dt.table + " SET doc = $1 WHERE "
	args := []any{string(doc)}
	for i, col := range dt.key {
		if i > 0 {
			query += " AND "
		}
		args = append(args, key[i])
		query += col + " = $" + strconv.Itoa(len(args))
	}
	res, err := s.(*Store).db.ExecContext(t.Context(), query, args...)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("%s: %d rows replaced (%v), want 1", query, n, err)
	}
}
