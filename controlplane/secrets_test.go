package controlplane

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/sqlstore"
)

// TestSecretConfigSealed: secret values are stored sealed, bound to their
// owner and key name; they reach the node in the clear as the function's
// environment; an update that sets a value to what it was leaves the
// record as it was; and a value that does not open (another key, or moved
// to another function's record) fails the call with an error that names
// it, never with a wrong value.
func TestSecretConfigSealed(t *testing.T) {
	f := newFnFixture(t)
	f.startNode("n1", echo)
	app, fn := f.deploy("app", api.Fn{Name: "echo", SecretConfig: map[string]string{"TOKEN": "s3cret-value"}})
	f.want(200, nil, "PUT", "/v2/apps/"+app.ID, api.App{SecretConfig: map[string]string{"A": "app-secret"}})

	var stored store.Fn
	err := f.st.View(context.Background(), func(tx store.Tx) error {
		var err error
		stored, err = tx.GetFn(fn.ID)
		if err != nil {
			return err
		}
		a, err := tx.GetApp(app.ID)
		for _, rec := range []any{stored, a} {
			raw, _ := json.Marshal(rec)
			if bytes.Contains(raw, []byte("s3cret-value")) || bytes.Contains(raw, []byte("app-secret")) {
				t.Errorf("a stored record holds a secret in the clear: %s", raw)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(stored.SealedConfig["TOKEN"]) == 0 || stored.SecretConfig != nil {
		t.Fatalf("stored function = %+v, want TOKEN sealed", stored)
	}

	status, h, body := f.do("POST", "/invoke/"+fn.ID, "x")
	if status != 201 || h.Get("X-Secret") != "s3cret-value" || h.Get("X-Config") != "app-secret" {
		t.Fatalf("invoke = %d %q, secret %q, app secret %q", status, body, h.Get("X-Secret"), h.Get("X-Config"))
	}

	// The same value again changes nothing, not even the sealed bytes.
	var again api.Fn
	f.want(200, &again, "PUT", "/v2/fns/"+fn.ID, api.Fn{SecretConfig: map[string]string{"TOKEN": "s3cret-value"}})
	if !again.UpdatedAt.Equal(fn.UpdatedAt) || again.SecretConfig["TOKEN"] != api.SecretRedacted {
		t.Errorf("setting a secret to its value: updated_at %v → %v, %v", fn.UpdatedAt, again.UpdatedAt, again.SecretConfig)
	}

	// A sealed value copied into another function's record does not open.
	_, other := f.deploy("app", api.Fn{Name: "other"})
	if err := f.st.Update(context.Background(), func(tx store.Tx) error {
		o, err := tx.GetFn(other.ID)
		if err != nil {
			return err
		}
		o.SealedConfig = stored.SealedConfig
		return tx.PutFn(o)
	}); err != nil {
		t.Fatal(err)
	}
	f.wantFnError(500, "the secret configuration TOKEN of fn "+other.ID+" cannot be opened with this control plane's key", "POST", "/invoke/"+other.ID, "x")

	// Another key: a clear error, not garbage.
	f.srv.cfg.RegistryKey = bytes.Repeat([]byte{9}, RegistryKeySize)
	f.srv.fn.forgetFn(fn.ID)
	f.wantFnError(500, "cannot be opened with this control plane's key (was the key replaced, or the value copied from another record?): set it again", "POST", "/invoke/"+fn.ID, "x")
	// Reads still show the keys, and setting the secret again repairs it.
	var got api.Fn
	f.want(200, &got, "GET", "/v2/fns/"+fn.ID, nil)
	if got.SecretConfig["TOKEN"] != api.SecretRedacted {
		t.Errorf("read with another key: %v", got.SecretConfig)
	}
	f.want(200, nil, "PUT", "/v2/apps/"+app.ID, api.App{SecretConfig: map[string]string{"A": "app-secret"}})
	f.want(200, nil, "PUT", "/v2/fns/"+fn.ID, api.Fn{SecretConfig: map[string]string{"TOKEN": "new-value"}})
	if status, h, _ := f.do("POST", "/invoke/"+fn.ID, "x"); status != 201 || h.Get("X-Secret") != "new-value" {
		t.Errorf("invoke after setting the secret again = %d, secret %q", status, h.Get("X-Secret"))
	}

	// Without a key, secrets cannot be set, and the error says why.
	f.srv.cfg.RegistryKey = nil
	f.wantFnError(503, "no key to seal secrets with", "PUT", "/v2/fns/"+fn.ID, api.Fn{SecretConfig: map[string]string{"K": "v"}})
}

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
	srv := New(Config{RegistryKey: bytes.Repeat([]byte{3}, RegistryKeySize), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, st, nil, nil)
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

	if err := srv.sealClearSecrets(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.sealClearSecrets(ctx); err != nil { // idempotent
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
