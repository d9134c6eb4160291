package record

import (
	"encoding/hex"

	"github.com/mercator/mercator/store"
)

// App checks that a can be stored: it needs an ID and a name.
func App(a store.App) error {
	if err := required("id", a.ID); err != nil {
		return err
	}
	return required("name", a.Name)
}

// Fn checks that f can be stored: it needs an ID, an app and a name.
func Fn(f store.Fn) error {
	for _, r := range [][2]string{{"id", f.ID}, {"app_id", f.AppID}, {"name", f.Name}} {
		if err := required(r[0], r[1]); err != nil {
			return err
		}
	}
	return nil
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
