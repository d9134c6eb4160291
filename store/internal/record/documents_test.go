package record

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/mercator/mercator/store"
)

// fill sets every exported field reachable from v to a value that is not
// zero and differs from its neighbours', so a converter that drops or
// swaps a field is caught.
func fill(t *testing.T, v reflect.Value, n *int) {
	*n++
	switch v.Type() {
	case reflect.TypeOf(json.RawMessage(nil)):
		v.Set(reflect.ValueOf(json.RawMessage(`{"n":` + string(rune('0'+*n%10)) + `}`)))
		return
	case reflect.TypeOf(time.Time{}):
		v.Set(reflect.ValueOf(time.Date(2026, 11, 30, 12, 0, *n, 0, time.UTC)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("s" + string(rune('a'+*n%26)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(t, p.Elem(), n)
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		fill(t, s.Index(0), n)
		fill(t, s.Index(1), n)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, n)
		fill(t, e, n)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i), n)
			}
		}
	default:
		t.Fatalf("fill: no value for a %s", v.Type())
	}
}

// roundTrip fills a T, encodes and decodes it, and wants it back whole.
func roundTrip[T any](t *testing.T) { roundTripValid[T](t, func(*T) {}) }

// roundTripValid is roundTrip with the filled T made storable by valid
// before it is encoded.
func roundTripValid[T any](t *testing.T, valid func(*T)) {
	t.Helper()
	var want T
	n := 0
	fill(t, reflect.ValueOf(&want).Elem(), &n)
	valid(&want)
	doc, err := Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode[T](doc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%T does not survive its stored document: a field was added to it (or to the api type it embeds) without a stored name in documents.go\n got %+v\nwant %+v\n doc %s", want, got, want, doc)
	}
}

func TestDocumentsKeepEveryField(t *testing.T) {
	// A storable run's Secrets are its sealed secrets' names, redacted
	// (Run refuses any other), read back from SealedSecrets.
	t.Run("run", func(t *testing.T) {
		roundTripValid(t, func(r *store.Run) {
			// Derived on every read, never stored: the redacted secrets, the queue position.
			r.Secrets, r.Queue = store.RedactedSecrets(r.SealedSecrets), nil
		})
	})
	t.Run("artifact", roundTrip[store.Artifact])
	t.Run("app", roundTrip[store.App])
	t.Run("fn", roundTrip[store.Fn])
	t.Run("trigger", roundTrip[store.Trigger])
	t.Run("call", roundTrip[store.Call])
	t.Run("node", roundTrip[store.Node])
	t.Run("operation", roundTrip[store.Operation])
	t.Run("session", roundTrip[store.Session])
	t.Run("invitation", roundTrip[store.Invitation])
	t.Run("token", roundTrip[store.Token])
	t.Run("registry credential", roundTrip[store.RegistryCredential])
	t.Run("project", func(t *testing.T) {
		// Derived on every read, never stored: the function reservations.
		roundTripValid(t, func(p *store.Project) { p.FunctionReservations = nil })
	})
}

// TestNilAttemptsStayNil: a run stored with no attempts ("attempts": null)
// reads back with none, not with an empty list.
func TestNilAttemptsStayNil(t *testing.T) {
	r := store.Run{}
	r.ID = "r-1"
	doc, err := Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode[store.Run](doc)
	if err != nil || got.Attempts != nil || got.Artifacts != nil {
		t.Errorf("Decode(%s) = %+v, %v", doc, got, err)
	}
}
