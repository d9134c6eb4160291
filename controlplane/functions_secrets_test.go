package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
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
		if err != nil {
			return err
		}
		for _, rec := range []any{stored, a} {
			raw, err := json.Marshal(rec)
			if err != nil {
				return err
			}
			if bytes.Contains(raw, []byte("s3cret-value")) || bytes.Contains(raw, []byte("app-secret")) {
				t.Errorf("a stored record holds a secret in the clear: %s", raw)
			}
		}
		return nil
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
	another := bytes.Repeat([]byte{9}, RegistryKeySize)
	f.srv.sealKey.Store(&another)
	f.skew.Add(int64(2 * time.Second)) // past the function cache's life (one second)
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
	f.srv.sealKey.Store(nil)
	f.wantFnError(503, "no key to seal secrets with", "PUT", "/v2/fns/"+fn.ID, api.Fn{SecretConfig: map[string]string{"K": "v"}})
}
