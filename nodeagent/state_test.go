package nodeagent

import (
	"testing"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

func openTestState(t *testing.T, dir string) *State {
	t.Helper()
	s, err := OpenState(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// nextEventID mints an event ID, failing the test on an error.
func nextEventID(t *testing.T, s *State) string {
	t.Helper()
	id, err := s.NextEventID()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// spooled reads up to max spooled events (0: all), failing the test on an error.
func spooled(t *testing.T, s *State, max int) []nodeproto.Event {
	t.Helper()
	got, err := s.Spooled(max)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func resultEvent(t *testing.T, s *State, op string) nodeproto.Event {
	t.Helper()
	return nodeproto.Event{ID: nextEventID(t, s), Kind: nodeproto.EventResult, Result: &nodeproto.Result{OperationID: op, Outcome: nodeproto.OutcomeOK}}
}

func TestStateDurableAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	s := openTestState(t, dir)
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	if err := s.Enrolled("n1", nodeproto.Enrollment{SessionToken: "tok", ExpiresAt: exp, FencingToken: 7}); err != nil {
		t.Fatal(err)
	}
	ev := resultEvent(t, s, "op-1")
	if err := s.MarkApplied("op-1", ev); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordStop(nodeproto.WorkloadKey{RunID: "r", Attempt: 1}, "timeout"); err != nil {
		t.Fatal(err)
	}
	last := nextEventID(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openTestState(t, dir)
	defer s.Close()
	if tok, e, ok := s.Session(); !ok || tok != "tok" || !e.Equal(exp) {
		t.Fatalf("session = %q %v %v", tok, e, ok)
	}
	if s.FencingToken() != 7 || s.NodeID() != "n1" {
		t.Fatalf("fencing %d node %q", s.FencingToken(), s.NodeID())
	}
	if !s.Applied("op-1") || s.Applied("op-2") {
		t.Fatal("applied memory lost or invented")
	}
	if got, ok := s.AppliedResult("op-1"); !ok || got.ID != ev.ID {
		t.Fatalf("applied result ID %q, want %q", got.ID, ev.ID)
	}
	inSpool := spooled(t, s, 0)
	if len(inSpool) != 1 || inSpool[0].ID != ev.ID {
		t.Fatalf("spool after reopen = %+v", inSpool)
	}
	if s.StopReason(nodeproto.WorkloadKey{RunID: "r", Attempt: 1}) != "timeout" {
		t.Fatal("stop reason lost")
	}
	next := nextEventID(t, s)
	if next <= last {
		t.Fatalf("event IDs not monotonic across reopen: %q after %q", next, last)
	}
}

func TestStateSpoolOrderAndAcknowledge(t *testing.T) {
	s := openTestState(t, t.TempDir())
	defer s.Close()
	var ids []string
	for i := 0; i < 2500; i++ { // crosses several ID reservation blocks
		id, err := s.NextEventID()
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > 0 && id <= ids[len(ids)-1] {
			t.Fatalf("ID %q not after %q", id, ids[len(ids)-1])
		}
		ids = append(ids, id)
	}
	// Spool out of order; the spool returns minting order.
	for _, i := range []int{5, 1, 2000, 3} {
		if err := s.Spool(nodeproto.Event{ID: ids[i], Kind: nodeproto.EventFacts}); err != nil {
			t.Fatal(err)
		}
	}
	got := spooled(t, s, 0)
	want := []string{ids[1], ids[3], ids[5], ids[2000]}
	for i := range want {
		if got[i].ID != want[i] {
			t.Fatalf("spool order %v, want %v", got, want)
		}
	}
	if got := spooled(t, s, 2); len(got) != 2 {
		t.Fatalf("Spooled(2) returned %d", len(got))
	}
	// Spooling the same event twice keeps one copy.
	if err := s.Spool(nodeproto.Event{ID: ids[3], Kind: nodeproto.EventFacts}); err != nil {
		t.Fatal(err)
	}
	if s.SpoolDepth() != 4 {
		t.Fatalf("depth %d, want 4", s.SpoolDepth())
	}
	if err := s.Acknowledge([]string{ids[1], ids[5]}); err != nil {
		t.Fatal(err)
	}
	got = spooled(t, s, 0)
	if len(got) != 2 || got[0].ID != ids[3] || got[1].ID != ids[2000] {
		t.Fatalf("after ack: %+v", got)
	}
}

// TestStateAcknowledgementsWrittenLazily: an acknowledged event is gone from
// Spooled at once; its removal reaches the file with the next write, or on
// Close; a crash before that delivers it again (the control plane
// deduplicates), and an event spooled again after its acknowledgement is
// owed again.
func TestStateAcknowledgementsWrittenLazily(t *testing.T) {
	dir := t.TempDir()
	s := openTestState(t, dir)
	ev := make([]nodeproto.Event, 3)
	for i := range ev {
		id := nextEventID(t, s)
		ev[i] = nodeproto.Event{ID: id, Kind: nodeproto.EventFacts}
		if err := s.Spool(ev[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Acknowledge([]string{ev[0].ID, ev[1].ID}); err != nil {
		t.Fatal(err)
	}
	if got := spooled(t, s, 0); len(got) != 1 || got[0].ID != ev[2].ID {
		t.Fatalf("after ack, spooled %+v, want only %s", got, ev[2].ID)
	}
	if s.SpoolDepth() != 1 {
		t.Fatalf("depth %d, want 1", s.SpoolDepth())
	}
	// A crash now (the file closed without State.Close): both come back.
	s.db.Close()
	s = openTestState(t, dir)
	if got := spooled(t, s, 0); len(got) != 3 {
		t.Fatalf("after a crash, spooled %d events, want all 3 again", len(got))
	}
	// Acknowledged, then written by the next write of any kind.
	if err := s.Acknowledge([]string{ev[0].ID}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordStop(nodeproto.WorkloadKey{RunID: "r", Attempt: 1}, "timeout"); err != nil {
		t.Fatal(err)
	}
	s.db.Close()
	s = openTestState(t, dir)
	if got := spooled(t, s, 0); len(got) != 2 || got[0].ID != ev[1].ID {
		t.Fatalf("after a write and a crash, spooled %+v, want %s and %s", got, ev[1].ID, ev[2].ID)
	}
	// Acknowledged, then spooled again (a redelivered command's result):
	// owed again, and still owed after Close wrote the acknowledgements.
	if err := s.Acknowledge([]string{ev[1].ID, ev[2].ID}); err != nil {
		t.Fatal(err)
	}
	if err := s.Spool(ev[1]); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTestState(t, dir)
	defer s.Close()
	if got := spooled(t, s, 0); len(got) != 1 || got[0].ID != ev[1].ID {
		t.Fatalf("after Close, spooled %+v, want only %s", got, ev[1].ID)
	}
}

// TestStateAppliedMemoryBounded: acknowledged operations are forgotten after
// AppliedRetention; unacknowledged ones are kept however old.
func TestStateAppliedMemoryBounded(t *testing.T) {
	s := openTestState(t, t.TempDir())
	defer s.Close()
	now := time.Now()
	s.now = func() time.Time { return now }
	evA, evB := resultEvent(t, s, "a"), resultEvent(t, s, "b")
	if err := s.MarkApplied("a", evA); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkApplied("b", evB); err != nil {
		t.Fatal(err)
	}
	if err := s.Acknowledge([]string{evA.ID}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(AppliedRetention + time.Minute)
	other := resultEvent(t, s, "c")
	if err := s.MarkApplied("c", other); err != nil {
		t.Fatal(err)
	}
	if err := s.Acknowledge([]string{other.ID}); err != nil {
		t.Fatal(err)
	}
	if s.Applied("a") {
		t.Fatal("acknowledged operation kept past retention")
	}
	if !s.Applied("b") || !s.Applied("c") {
		t.Fatal("operation that may still be redelivered was forgotten")
	}
	if s.AppliedCount() != 2 {
		t.Fatalf("applied count %d, want 2", s.AppliedCount())
	}
}

func TestStateWorkloadChanged(t *testing.T) {
	dir := t.TempDir()
	s := openTestState(t, dir)
	started := time.Now().UTC()
	o := nodeproto.WorkloadObservation{WorkloadKey: nodeproto.WorkloadKey{RunID: "r", Attempt: 1}, Phase: nodeproto.PhaseRunning, StartedAt: &started}
	if !s.WorkloadChanged(o) {
		t.Fatal("new workload not reported as changed")
	}
	if err := s.RecordWorkload(o); err != nil {
		t.Fatal(err)
	}
	if s.WorkloadChanged(o) {
		t.Fatal("unchanged workload reported again")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTestState(t, dir)
	defer s.Close()
	if s.WorkloadChanged(o) {
		t.Fatal("unchanged workload reported again after restart")
	}
	code := 0
	o.Phase, o.ExitCode = nodeproto.PhaseExited, &code
	if !s.WorkloadChanged(o) {
		t.Fatal("exit not reported")
	}
}

func TestStateRefusesSecondOpener(t *testing.T) {
	dir := t.TempDir()
	s := openTestState(t, dir)
	defer s.Close()
	if _, err := OpenState(dir); err == nil {
		t.Fatal("second agent opened the same state")
	}
}
