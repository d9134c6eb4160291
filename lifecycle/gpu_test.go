package lifecycle

import (
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

// TestGPUFailedSpendsNoRetry: an attempt ended by a bad GPU fails typed and
// the run is retried even with no retry budget; the container's exit that
// follows the stop changes nothing; a later ordinary failure still ends a
// run that has no budget.
func TestGPUFailedSpendsNoRetry(t *testing.T) {
	r := newRun(0)
	Place(r, "n1", []string{"GPU-a"}, t0)
	Observe(r, "n1", obs(1, nodeproto.PhaseRunning, nil), t0)
	lost := []SickGPU{{UUID: "GPU-a", Reason: "gpu_lost", Detail: "GPU is lost"}}
	if GPUFailed(r, "n2", lost, t0) != nil {
		t.Fatal("another node's report ended the attempt")
	}
	if GPUFailed(r, "n1", []SickGPU{{UUID: "GPU-z", Reason: "gpu_lost"}}, t0) != nil {
		t.Fatal("a GPU the attempt does not hold ended it")
	}
	if a := GPUFailed(r, "n1", lost, t0); a == nil || !a.StopRequested {
		t.Fatalf("the attempt was not ended, or not marked for its stop: %+v", a)
	}
	a := r.Attempts[0]
	if a.Status != api.AttemptFailed || a.Failure == nil || a.Failure.Kind != api.AttemptFailureGPU || a.Failure.GPU != "GPU-a" || a.Failure.Reason != "gpu_lost" {
		t.Fatalf("attempt %+v", a)
	}
	if r.Status != api.RunQueued {
		t.Fatalf("run %s (%s), want queued for a retry that spends no budget", r.Status, r.Reason)
	}
	if Observe(r, "n1", obs(1, nodeproto.PhaseExited, ptr(137)), t0); r.Attempts[0].Status != api.AttemptFailed || r.Attempts[0].Failure == nil || r.Status != api.RunQueued {
		t.Fatalf("the stopped container's exit changed the outcome: %+v, run %s", r.Attempts[0], r.Status)
	}
	if GPUFailed(r, "n1", lost, t0) != nil {
		t.Fatal("an ended attempt was ended twice")
	}
	Place(r, "n2", []string{"GPU-b"}, t0)
	Observe(r, "n2", obs(2, nodeproto.PhaseExited, ptr(1)), t0)
	if r.Status != api.RunFailed {
		t.Fatalf("an ordinary failure with no budget left: run %s (%s)", r.Status, r.Reason)
	}
}

// TestRecordXids: an application Xid is filed against the active attempt
// holding its GPU, and only there.
func TestRecordXids(t *testing.T) {
	r := newRun(0)
	Place(r, "n1", []string{"GPU-a"}, t0)
	xids := []api.GPUXid{{GPU: "GPU-a", Xid: 13, At: t0}, {GPU: "GPU-b", Xid: 31, At: t0}}
	if RecordXids(r, "n2", xids) {
		t.Fatal("another node's Xid was filed")
	}
	if !RecordXids(r, "n1", xids) || len(r.Attempts[0].Xids) != 1 || r.Attempts[0].Xids[0].Xid != 13 {
		t.Fatalf("Xids %+v, want the one for GPU-a", r.Attempts[0].Xids)
	}
	Observe(r, "n1", obs(1, nodeproto.PhaseExited, ptr(0)), t0)
	if RecordXids(r, "n1", xids) {
		t.Fatal("an Xid was filed against an ended attempt")
	}
}

// TestUsageRecordedAndIdleFlagged: an observation's GPU usage is kept on the
// attempt (a later summary replaces it, and counts as a change), and a GPU
// idle for GPUIdleFlagAfter in one stretch is flagged.
func TestUsageRecordedAndIdleFlagged(t *testing.T) {
	r := newRun(0)
	Place(r, "n1", []string{"GPU-a", "GPU-b"}, t0)
	o := obs(1, nodeproto.PhaseRunning, nil)
	o.GPUUsage = []nodeproto.GPUUsage{{UUID: "GPU-a", Samples: 3, UtilAvg: 90, Through: t0}, {UUID: "GPU-b", Samples: 3, LongestIdleSec: 1799, Through: t0}}
	Observe(r, "n1", o, t0)
	if u := r.Attempts[0].GPUUsage; len(u) != 2 || u[0].UtilAvg != 90 || u[1].Idle {
		t.Fatalf("usage %+v", u)
	}
	o.GPUUsage = []nodeproto.GPUUsage{{UUID: "GPU-a", Samples: 4, Through: t0.Add(time.Minute)}, {UUID: "GPU-b", Samples: 4, LongestIdleSec: 1800, Through: t0.Add(time.Minute)}}
	if !Observe(r, "n1", o, t0.Add(time.Minute)) || !r.Attempts[0].GPUUsage[1].Idle {
		t.Fatalf("a later summary: %+v", r.Attempts[0].GPUUsage)
	}
}
