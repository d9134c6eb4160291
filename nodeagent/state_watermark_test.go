package nodeagent

import (
	"testing"

	"github.com/mercator/mercator/nodeproto"
)

// TestThrough: the watermark stays below every event that may still be
// sent, owed or minted and not yet spooled, and passes what was
// acknowledged or abandoned.
func TestThrough(t *testing.T) {
	s, err := OpenState(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	seq := func(id string) uint64 {
		_, n, ok := nodeproto.ParseEventID(id)
		if !ok {
			t.Fatalf("%q is not an event ID", id)
		}
		return n
	}
	through := func() uint64 { return seq(s.Through()) }
	ids := make([]string, 4)
	for i := range ids {
		if ids[i], err = s.NextEventID(); err != nil {
			t.Fatal(err)
		}
	}
	if s.Through() != "" && through() >= seq(ids[0]) {
		t.Fatalf("through %s with %s minted and not spooled", s.Through(), ids[0])
	}
	for _, id := range ids[1:] {
		if err := s.Spool(nodeproto.Event{ID: id, Kind: nodeproto.EventFacts}); err != nil {
			t.Fatal(err)
		}
	}
	if s.Through() != "" && through() >= seq(ids[0]) {
		t.Fatalf("through %s passed %s, minted and still not spooled", s.Through(), ids[0])
	}
	s.abandon(seq(ids[0]))
	if got, want := through(), seq(ids[1])-1; got != want {
		t.Fatalf("through %d with %s abandoned and the rest owed, want %d", got, ids[0], want)
	}
	if err := s.Acknowledge(ids[1:3]); err != nil {
		t.Fatal(err)
	}
	if got, want := through(), seq(ids[3])-1; got != want {
		t.Fatalf("through %d with only %s owed, want %d", got, ids[3], want)
	}
	if err := s.Acknowledge(ids[3:]); err != nil {
		t.Fatal(err)
	}
	if got, want := through(), seq(ids[3]); got != want {
		t.Fatalf("through %d with nothing owed, want the last minted, %d", got, want)
	}
}
