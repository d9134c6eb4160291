package lifecycle

import (
	"reflect"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

// TestSameAttemptSeesEveryField: sameAttempt compares field by field, so a
// field added to api.Attempt and not compared there would make Observe miss
// a change. Each field is changed in turn.
func TestSameAttemptSeesEveryField(t *testing.T) {
	var base api.Attempt
	typ := reflect.TypeOf(base)
	for i := 0; i < typ.NumField(); i++ {
		other := base
		f := reflect.ValueOf(&other).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString("x")
		case reflect.Int:
			f.SetInt(7)
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		case reflect.Struct:
			f.Set(reflect.ValueOf(time.Unix(5, 0)))
		default:
			t.Fatalf("field %s has kind %s, which this test does not know how to change", typ.Field(i).Name, f.Kind())
		}
		if sameAttempt(base, other) {
			t.Errorf("sameAttempt does not see a change of %s", typ.Field(i).Name)
		}
	}
	// Pointers are compared by what they point to.
	t1, t2 := time.Unix(9, 0), time.Unix(9, 0)
	if !sameAttempt(api.Attempt{StartedAt: &t1}, api.Attempt{StartedAt: &t2}) {
		t.Error("equal moments behind different pointers read as a change")
	}
}

// TestObserveSameObservationChangesNothing: an observation repeated (with
// equal moments in fresh pointers, as every event decodes them) reports no
// change and leaves UpdatedAt alone.
func TestObserveSameObservationChangesNothing(t *testing.T) {
	placed := time.Unix(100, 0)
	r := &api.Run{ID: "r1", Status: api.RunQueued}
	Place(r, "n1", nil, placed)
	obs := func() nodeproto.WorkloadObservation {
		started := time.Unix(101, 0)
		return nodeproto.WorkloadObservation{WorkloadKey: nodeproto.WorkloadKey{RunID: "r1", Attempt: 1},
			ContainerID: "c1", Phase: nodeproto.PhaseRunning, StartedAt: &started}
	}
	if !Observe(r, "n1", obs(), time.Unix(102, 0)) {
		t.Fatal("the first running observation changed nothing")
	}
	if r.Status != api.RunRunning || !r.UpdatedAt.Equal(time.Unix(102, 0)) {
		t.Fatalf("after the first observation: status %s, updated %v", r.Status, r.UpdatedAt)
	}
	if Observe(r, "n1", obs(), time.Unix(103, 0)) {
		t.Error("the same observation again reported a change")
	}
	if !r.UpdatedAt.Equal(time.Unix(102, 0)) {
		t.Errorf("UpdatedAt moved to %v on an observation that changed nothing", r.UpdatedAt)
	}
}
