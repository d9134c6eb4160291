package lifecycle

import (
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func obs(attempt int, phase string, code *int) nodeproto.WorkloadObservation {
	started := t0.Add(time.Second)
	o := nodeproto.WorkloadObservation{WorkloadKey: nodeproto.WorkloadKey{RunID: "r", Attempt: attempt}, ContainerID: "c", Phase: phase, StartedAt: &started}
	if phase == nodeproto.PhaseExited {
		fin := t0.Add(2 * time.Second)
		o.FinishedAt, o.ExitCode = &fin, code
	}
	return o
}

func ptr(n int) *int { return &n }

func newRun(retries int) *api.Run {
	return &api.Run{ID: "r", RunSpec: api.RunSpec{Retries: retries}, Status: api.RunQueued}
}

func TestHappyPath(t *testing.T) {
	r := newRun(0)
	Place(r, "n1", nil, t0)
	if r.Status != api.RunPlaced {
		t.Fatal(r.Status)
	}
	Observe(r, "n1", obs(1, nodeproto.PhasePreparing, nil), t0)
	if r.Status != api.RunPreparing {
		t.Fatal(r.Status)
	}
	Observe(r, "n1", obs(1, nodeproto.PhaseRunning, nil), t0)
	if r.Status != api.RunRunning || r.Attempts[0].StartedAt == nil {
		t.Fatalf("%s %+v", r.Status, r.Attempts[0])
	}
	if !Observe(r, "n1", obs(1, nodeproto.PhaseExited, ptr(0)), t0) || r.Status != api.RunSucceeded || *r.ExitCode != 0 || r.FinishedAt == nil {
		t.Fatalf("%+v", r)
	}
	// A redelivered or late observation changes nothing.
	if Observe(r, "n1", obs(1, nodeproto.PhaseRunning, nil), t0) || r.Status != api.RunSucceeded {
		t.Fatalf("late observation moved an ended run: %s", r.Status)
	}
}

func TestObservationFromAnotherNodeIgnored(t *testing.T) {
	r := newRun(0)
	Place(r, "n1", nil, t0)
	if Observe(r, "n2", obs(1, nodeproto.PhaseExited, ptr(1)), t0) || r.Status != api.RunPlaced {
		t.Fatalf("foreign observation applied: %s", r.Status)
	}
}

func TestRetriesThenFails(t *testing.T) {
	r := newRun(1)
	Place(r, "n1", nil, t0)
	Observe(r, "n1", obs(1, nodeproto.PhaseExited, ptr(3)), t0)
	if r.Status != api.RunQueued || !strings.Contains(r.Reason, "retrying") {
		t.Fatalf("%s %q", r.Status, r.Reason)
	}
	Place(r, "n2", nil, t0)
	Observe(r, "n2", obs(2, nodeproto.PhaseExited, ptr(4)), t0)
	if r.Status != api.RunFailed || *r.ExitCode != 4 || !strings.Contains(r.Reason, "attempt 2 exited with code 4") {
		t.Fatalf("%s %v %q", r.Status, r.ExitCode, r.Reason)
	}
}

func TestTimeoutIsNotRetried(t *testing.T) {
	r := newRun(3)
	r.TimeoutSeconds = 5
	Place(r, "n1", nil, t0)
	o := obs(1, nodeproto.PhaseExited, ptr(0))
	o.StopReason = "timeout"
	Observe(r, "n1", o, t0)
	if r.Status != api.RunFailed || !strings.Contains(r.Reason, "timed out after 5s") {
		t.Fatalf("%s %q", r.Status, r.Reason)
	}
}

func TestLaunchFailure(t *testing.T) {
	r := newRun(0)
	Place(r, "n1", nil, t0)
	if !LaunchFailed(r, "n1", 1, "could not start: no such image", t0) || r.Status != api.RunFailed || r.ExitCode != nil {
		t.Fatalf("%+v", r)
	}
}

func TestCancel(t *testing.T) {
	r := newRun(0)
	if Cancel(r, t0) != nil || r.Status != api.RunCancelled {
		t.Fatal("queued run not cancelled at once")
	}
	r = newRun(5)
	Place(r, "n1", nil, t0)
	Observe(r, "n1", obs(1, nodeproto.PhaseRunning, nil), t0)
	if a := Cancel(r, t0); a == nil || a.Number != 1 {
		t.Fatal("running run: no attempt to stop")
	}
	if r.Status != api.RunRunning {
		t.Fatal("cancel must wait for the node's report")
	}
	o := obs(1, nodeproto.PhaseExited, ptr(143))
	o.StopReason = "cancelled"
	Observe(r, "n1", o, t0)
	if r.Status != api.RunCancelled || len(r.Attempts) != 1 {
		t.Fatalf("%s after %d attempts: retried a cancelled run?", r.Status, len(r.Attempts))
	}
}

func TestReplaceAndStrays(t *testing.T) {
	r := newRun(0)
	Place(r, "n1", nil, t0)
	Observe(r, "n1", obs(1, nodeproto.PhaseRunning, nil), t0)
	if d, ok := ReplaceAfter(r); !ok || d != DefaultReplaceAfter {
		t.Fatal("default replace-after")
	}
	a := Replace(r, t0, t0.Add(time.Hour))
	if a == nil || !a.Replaced || r.Status != api.RunQueued || !strings.Contains(r.Reason, "unreachable") {
		t.Fatalf("replace: %+v %s %q", a, r.Status, r.Reason)
	}
	if Replace(r, t0, t0) != nil {
		t.Fatal("replaced twice")
	}
	Place(r, "n2", nil, t0)
	Observe(r, "n2", obs(2, nodeproto.PhaseRunning, nil), t0)
	strays := Strays(r)
	if len(strays) != 1 || strays[0].Number != 1 {
		t.Fatalf("strays = %+v, want attempt 1", strays)
	}
	// The old node comes back: its attempt exits; the run is not affected.
	Observe(r, "n1", obs(1, nodeproto.PhaseExited, ptr(137)), t0)
	if r.Status != api.RunRunning || r.Attempts[0].Status != api.AttemptFailed {
		t.Fatalf("old attempt's exit moved the run: %s %s", r.Status, r.Attempts[0].Status)
	}
	if len(Strays(r)) != 0 {
		t.Fatal("an exited attempt is not a stray")
	}
	never := newRun(0)
	never.ReplaceAfterSeconds = -1
	if _, ok := ReplaceAfter(never); ok {
		t.Fatal("negative replace-after means never")
	}
}

// TestPrepareProgress: a preparing observation's progress is shown on the
// attempt, a repeat of it changes nothing, and it is gone once the attempt
// runs (a late progress report does not bring it back).
func TestPrepareProgress(t *testing.T) {
	r := &api.Run{ID: "r1", RunSpec: api.RunSpec{}, Status: api.RunQueued}
	Place(r, "n1", nil, t0)
	o := obs(1, nodeproto.PhasePreparing, nil)
	o.Progress = &nodeproto.PrepareProgress{Step: nodeproto.ProgressImage, DoneBytes: 10, TotalBytes: 100}
	if !Observe(r, "n1", o, t0) || r.Status != api.RunPreparing || *r.Attempts[0].Progress != (api.PrepareProgress{Step: "image", DoneBytes: 10, TotalBytes: 100}) {
		t.Fatalf("first report: %s %+v", r.Status, r.Attempts[0].Progress)
	}
	again := o
	again.Progress = &nodeproto.PrepareProgress{Step: nodeproto.ProgressImage, DoneBytes: 10, TotalBytes: 100}
	if Observe(r, "n1", again, t0) {
		t.Error("the same progress again reported a change")
	}
	again.Progress = &nodeproto.PrepareProgress{Step: nodeproto.ProgressImage, DoneBytes: 60, TotalBytes: 100}
	if !Observe(r, "n1", again, t0) || r.Attempts[0].Progress.DoneBytes != 60 {
		t.Errorf("moved progress: %+v", r.Attempts[0].Progress)
	}
	Observe(r, "n1", obs(1, nodeproto.PhaseRunning, nil), t0)
	if r.Attempts[0].Progress != nil {
		t.Errorf("running attempt keeps its progress: %+v", r.Attempts[0].Progress)
	}
	Observe(r, "n1", o, t0)
	if r.Attempts[0].Progress != nil || r.Status != api.RunRunning {
		t.Errorf("a late report: %s %+v", r.Status, r.Attempts[0].Progress)
	}
}
