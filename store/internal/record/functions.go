package record

import (
	"encoding/hex"

	"github.com/mercator/mercator/failure"

	"github.com/mercator/mercator/store"
)

// App checks that a can be stored: it needs an ID and a name, and no
// secret in the clear (see store.App).
func App(a store.App) error {
	if err := required("id", a.ID); err != nil {
		return err
	}
	if err := required("name", a.Name); err != nil {
		return err
	}
	return sealedOnly("app", a.ID, a.SecretConfig)
}

// Fn checks that f can be stored: it needs an ID, an app and a name, and
// no secret in the clear (see store.App).
func Fn(f store.Fn) error {
	for _, r := range [][2]string{{"id", f.ID}, {"app_id", f.AppID}, {"name", f.Name}} {
		if err := required(r[0], r[1]); err != nil {
			return err
		}
	}
	return sealedOnly("fn", f.ID, f.SecretConfig)
}

// sealedOnly refuses secret configuration in the clear: a store holds
// secrets only sealed (SealedConfig), so a caller that forgot to seal
// fails here rather than writing the secret to disk.
func sealedOnly(kind, id string, clear map[string]string) error {
	if len(clear) == 0 {
		return nil
	}
	return failure.Invalid("secret_config", "%s %s: secret configuration must be sealed before it is stored (SealedConfig); a store never holds it in the clear", kind, id)
}

// Trigger checks that t can be stored: it needs an ID, an app, a function,
// a name, a type and a source.
func Trigger(t store.Trigger) error {
	for _, r := range [][2]string{{"id", t.ID}, {"app_id", t.AppID}, {"fn_id", t.FnID}, {"name", t.Name}, {"type", t.Type}, {"source", t.Source}} {
		if err := required(r[0], r[1]); err != nil {
			return err
		}
	}
	return nil
}

// Call checks that c can be stored: it needs an ID and a function.
func Call(c store.Call) error {
	if err := required("id", c.ID); err != nil {
		return err
	}
	return required("fn_id", c.FnID)
}

// NameKey is the sort key of a name: its bytes in hex, which every
// database orders byte-wise whatever its collation, so lists and cursors
// page the same way in SQLite, PostgreSQL and memstore.
func NameKey(name string) string { return hex.EncodeToString([]byte(name)) }
