package sqlstore

import (
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
)

// TestRegistryCredentialsMigrateToDefault: a credential stored at schema
// version 9 (keyed by host alone) is the default project's after
// migration 10, and another project may then hold one for the same host.
func TestRegistryCredentialsMigrateToDefault(t *testing.T) {
	forEachDB(t, func(t *testing.T, tdb testDB) {
		s, _ := tdb.open(t)
		ctx := t.Context()
		old := store.RegistryCredential{Host: "ghcr.io", Username: "bot", Sealed: []byte{1, 2, 3}}
		doc, err := encode("registry credential", old.Host, old)
		if err != nil {
			t.Fatal(err)
		}
		for _, stmt := range []string{ // back to version 9's table, holding one credential
			`DROP TABLE registry_credentials`,
			`CREATE TABLE registry_credentials (host TEXT PRIMARY KEY, doc TEXT NOT NULL)`,
			`DROP INDEX invitations_by_node`,    // migration 11's, made again after 10
			`ALTER TABLE nodes DROP COLUMN rev`, // migration 12's
			`DROP TABLE node_seen`,              // migration 13's
			`DELETE FROM schema_migrations WHERE version >= 10`,
		} {
			if _, err := s.db.ExecContext(ctx, stmt); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.db.ExecContext(ctx, `INSERT INTO registry_credentials (host, doc) VALUES ($1, $2)`, old.Host, doc); err != nil {
			t.Fatal(err)
		}
		if err := migrate(ctx, s.db, s.d, migrations); err != nil {
			t.Fatal(err)
		}
		mine := store.RegistryCredential{Project: "vision", Host: "ghcr.io", Username: "vision-bot", Sealed: []byte{4}}
		if err := s.Update(ctx, func(tx store.Tx) error { return tx.PutRegistryCredential(mine) }); err != nil {
			t.Fatal(err)
		}
		err = s.View(ctx, func(tx store.Tx) error {
			got, err := tx.GetRegistryCredential(api.DefaultProject, "ghcr.io")
			if err != nil || got.Username != "bot" || got.Project != "" {
				t.Errorf("migrated credential = %+v, %v; want bot's, in the default project", got, err)
			}
			if got, err := tx.GetRegistryCredential("vision", "ghcr.io"); err != nil || got.Username != "vision-bot" {
				t.Errorf("vision's credential = %+v, %v", got, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
