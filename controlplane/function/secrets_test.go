package function

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/sealing"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/sqlstore"
)

// keySealer seals with a fixed key, as the control plane does with its own.
type keySealer []byte

func (k keySealer) Seal(ad []byte, plain string) ([]byte, error) { return sealing.Seal(k, ad, plain) }
func (k keySealer) Unseal(ad, sealed []byte) (string, error)     { return sealing.Unseal(k, ad, sealed) }

// TestClearSecretsSealedOnStart: secret values an earlier version stored
// in the clear keep reaching the function before the control plane seals
// them, and after its start step no row holds them in the clear, nor any
// byte of the SQLite file.
func TestClearSecretsSealedOnStart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "mercator.db")
	st, err := sqlstore.Open(ctx, "sqlite://"+path)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	// The rows an earlier version wrote: secret_config in the clear.
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct{ stmt, id, name, doc string }{
		{`INSERT INTO fn_apps (id, name, name_key, doc) VALUES ($1, $2, $3, $4)`, "app-old", "old",
			`{"id":"app-old","name":"old","config":{"A":"1"},"secret_config":{"APP_TOKEN":"legacy-app-secret"}}`},
		{`INSERT INTO fn_fns (id, app_id, name, name_key, doc) VALUES ($1, 'app-old', $2, $3, $4)`, "fn-old", "f",
			`{"id":"fn-old","app_id":"app-old","name":"f","image":"r/f:1","secret_config":{"TOKEN":"legacy-fn-secret"}}`},
	} {
		if _, err := db.Exec(q.stmt, q.id, q.name, hex.EncodeToString([]byte(q.name)), q.doc); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	if len(filesHolding(t, []string{path, path + "-wal"}, "legacy-fn-secret")) == 0 {
		t.Fatal("the clear rows are not in the file: searching it would prove nothing")
	}

	st, err = sqlstore.Open(ctx, "sqlite://"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := New(Config{Store: st, Now: time.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, nil,
		keySealer(bytes.Repeat([]byte{3}, sealing.KeySize)))
	env := func() map[string]string {
		t.Helper()
		var env map[string]string
		if err := st.View(ctx, func(tx store.Tx) error {
			f, err := tx.GetFn("fn-old")
			if err != nil {
				return err
			}
			a, err := tx.GetApp("app-old")
			if err != nil {
				return err
			}
			if v := srv.fnView(f); v.SecretConfig["TOKEN"] != api.SecretRedacted {
				t.Errorf("function read = %v", v.SecretConfig)
			}
			env, err = srv.functionEnv(a, f)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return env
	}
	if e := env(); e["TOKEN"] != "legacy-fn-secret" || e["APP_TOKEN"] != "legacy-app-secret" || e["A"] != "1" {
		t.Fatalf("environment from clear values = %v", e)
	}

	if err := srv.SealClearSecrets(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.SealClearSecrets(ctx); err != nil { // idempotent
		t.Fatal(err)
	}
	if e := env(); e["TOKEN"] != "legacy-fn-secret" || e["APP_TOKEN"] != "legacy-app-secret" {
		t.Fatalf("environment from sealed values = %v", e)
	}
	db, err = sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT doc FROM fn_apps UNION ALL SELECT doc FROM fn_fns`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			t.Fatal(err)
		}
		n++
		if strings.Contains(doc, "legacy-") || strings.Contains(doc, "secret_config") || !strings.Contains(doc, "sealed_config") {
			t.Errorf("row after the start step: %s", doc)
		}
	}
	if n != 2 {
		t.Errorf("%d rows, want 2", n)
	}
	// Nor does the file's free space, or its write-ahead log.
	if p := filesHolding(t, []string{path, path + "-wal"}, "legacy-fn-secret", "legacy-app-secret"); len(p) > 0 {
		t.Errorf("%v still hold a secret in the clear", p)
	}
}

// filesHolding returns those of paths whose bytes contain any of needles.
func filesHolding(t *testing.T, paths []string, needles ...string) []string {
	t.Helper()
	var out []string
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, n := range needles {
			if bytes.Contains(data, []byte(n)) {
				out = append(out, p)
				break
			}
		}
	}
	return out
}
