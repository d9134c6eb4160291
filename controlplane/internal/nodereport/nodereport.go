// Package nodereport applies what a node reports to the control plane's
// records, inside the transaction the caller gives it: a batch's events one
// by one (Event: facts, observed workloads, command results), what a facts
// report found about GPUs (GPUReport), and the stop of every attempt that
// may still run but must not, a stray (StopStrays, HasStrays,
// SweepStrays). It reports which runs changed and which ended, so the
// caller can wake waiters and count terminal statuses once its transaction
// commits.
//
// It exists so that the meaning of a node's report is one piece with a
// narrow contract (Applier: a clock, a log, and Issue, which stores a
// command under the node's fencing token), apart from the node protocol's
// HTTP handling, deduplication, group commit and signals
// (controlplane/nodes_protocol.go). It holds no state. Only package
// controlplane imports it.
package nodereport

import (
	"errors"
	"log/slog"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/factcheck"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Applier applies node reports. Its fields are the control plane's.
type Applier struct {
	Now func() time.Time
	Log *slog.Logger
	// Issue stores a command for a node under the node's current fencing
	// token in tx; the caller wakes the node's session once tx commits.
	Issue func(tx store.Tx, nodeID string, cmd nodeproto.Command) error
}

// Event applies one fresh event inside tx and reports whether a run
// changed and, when a run became terminal, its new status. A facts report
// is checked before it is believed (factcheck.Apply), and what that found
// is added to found.
func (ap Applier) Event(tx store.Tx, nodeID string, ev nodeproto.Event, found *[]factcheck.Outcome) (changed bool, ended string, err error) {
	now := ap.Now()
	switch ev.Kind {
	case nodeproto.EventFacts:
		if ev.Facts == nil {
			return false, "", nil
		}
		o, err := factcheck.Apply(tx, nodeID, ev.Facts, now)
		*found = append(*found, o)
		if err != nil {
			return false, "", err
		}
		// What the report found about GPUs reaches the attempts on them
		// (GPUReport); capacity changed, so placements may now fit.
		ended, err := ap.GPUReport(tx, nodeID, o)
		return true, ended, err
	case nodeproto.EventWorkload:
		o := ev.Workload
		if o == nil {
			return false, "", nil
		}
		run, err := tx.GetRun(o.RunID)
		if errors.Is(err, failure.ErrNotFound) {
			return false, "", nil // not ours (a container from another control plane)
		}
		if err != nil {
			return false, "", err
		}
		was := run.Status
		changed := lifecycle.Observe(&run.Run, nodeID, *o, now)
		stopped, err := ap.StopStrays(tx, &run.Run, nodeID)
		if err != nil {
			return false, "", err
		}
		if !changed && !stopped {
			return false, "", nil
		}
		return true, EndedStatus(was, run.Status), tx.PutRun(run)
	case nodeproto.EventResult:
		res := ev.Result
		if res == nil {
			return false, "", nil
		}
		op, err := tx.GetOperation(res.OperationID)
		if errors.Is(err, failure.ErrNotFound) {
			return false, "", nil
		}
		if err != nil {
			return false, "", err
		}
		if op.NodeID != nodeID || op.Result != nil {
			return false, "", nil
		}
		op.Result = res
		if err := tx.PutOperation(op); err != nil {
			return false, "", err
		}
		if res.Outcome == nodeproto.OutcomeOK || res.Workload == nil || op.Command.Kind != nodeproto.KindLaunchWorkload {
			return false, "", nil
		}
		run, err := tx.GetRun(res.Workload.RunID)
		if err != nil {
			return false, "", err
		}
		was := run.Status
		if !lifecycle.LaunchFailed(&run.Run, nodeID, res.Workload.Attempt, "could not start: "+res.Error, now) {
			return false, "", nil
		}
		if _, err := ap.StopStrays(tx, &run.Run, nodeID); err != nil { // a gang's other members
			return false, "", err
		}
		return true, EndedStatus(was, run.Status), tx.PutRun(run)
	}
	return false, "", nil // an event kind from a newer agent: held, not applied
}

// StopStrays issues a stop for every attempt of the run on this node that
// may still be running but must not (see lifecycle.Strays), and reports
// whether it issued any. It is called when a node reports on a run, which is
// when a replaced attempt on a returning node shows itself.
//
// A gang's strays are stopped on every node, whichever reported: one
// member's end is what makes the others strays (lifecycle.Strays).
func (ap Applier) StopStrays(tx store.Tx, run *api.Run, nodeID string) (bool, error) {
	issued := false
	for _, a := range lifecycle.Strays(run) {
		if a.NodeID != nodeID && !lifecycle.Gang(run) {
			continue
		}
		reason := StrayReason(run, a)
		if err := ap.Issue(tx, a.NodeID, nodeproto.Command{Kind: nodeproto.KindStopWorkload, StopWorkload: &nodeproto.StopWorkloadCommand{
			WorkloadKey: nodeproto.WorkloadKey{RunID: run.ID, Attempt: a.Number}, Reason: reason, GracePeriod: GraceOf(store.Run{Run: *run})}}); err != nil {
			return false, err
		}
		a.StopRequested = true
		issued = true
		ap.Log.Info("stopping stray attempt", "run", run.ID, "attempt", a.Number, "node", a.NodeID, "reason", reason)
	}
	return issued, nil
}

// SweepStrays stops the node's stray attempts when it opens a session. A
// node returning from a partition or a restart may hold an attempt that was
// replaced meanwhile and say nothing new about it (its container is running,
// as it was when last reported), so the control plane cannot wait for an
// observation to notice it.
//
// The session stream looks for strays in its first read (HasStrays) and
// takes a write transaction (SweepStrays) only when there is one: a fleet
// reconnecting (after a restart of the control plane, or of a replica) must
// not queue ten thousand empty write transactions on the store's writer.
func HasStrays(tx store.Tx, nodeID string) (bool, error) {
	runs, err := tx.ListRuns(store.ListRunsOptions{NodeID: nodeID})
	for _, run := range runs {
		for _, a := range lifecycle.Strays(&run.Run) {
			if a.NodeID == nodeID {
				return true, err
			}
		}
	}
	return false, err
}

func (ap Applier) SweepStrays(tx store.Tx, nodeID string) error {
	runs, err := tx.ListRuns(store.ListRunsOptions{NodeID: nodeID})
	if err != nil {
		return err
	}
	for _, run := range runs {
		stopped, err := ap.StopStrays(tx, &run.Run, nodeID)
		if err != nil {
			return err
		}
		if stopped {
			if err := tx.PutRun(run); err != nil {
				return err
			}
		}
	}
	return nil
}

// EndedStatus is the new status when a run just became terminal, else "".
func EndedStatus(was, now string) string {
	if !api.Terminal(was) && api.Terminal(now) {
		return now
	}
	return ""
}

// GPUReport applies to the attempts on nodeID what a facts report
// found about their GPUs (factcheck.Outcome): an attempt holding a GPU the
// report quarantined ends as gpu_failed, its container is stopped and its
// run goes back to the queue (lifecycle.GPUFailed); an application Xid is
// filed against the attempt holding its GPU (lifecycle.RecordXids). It
// returns the terminal status a run reached, if one did: only a run whose
// cancel was pending ends here, and the caller counts one such status per
// event (a second in the same report goes uncounted in the metric; the run
// itself is right).
func (ap Applier) GPUReport(tx store.Tx, nodeID string, o factcheck.Outcome) (string, error) {
	if len(o.Quarantined) == 0 && len(o.AppXids) == 0 {
		return "", nil
	}
	runs, err := tx.ListRuns(store.ListRunsOptions{NodeID: nodeID, Statuses: []string{api.RunPlaced, api.RunPreparing, api.RunRunning}})
	if err != nil {
		return "", err
	}
	ended := ""
	for _, listed := range runs {
		run, err := tx.GetRun(listed.ID) // through the batch's memo: an earlier event may have moved it
		if err != nil {
			return "", err
		}
		was, filed := run.Status, lifecycle.RecordXids(&run.Run, nodeID, o.AppXids)
		if a := lifecycle.GPUFailed(&run.Run, nodeID, o.Quarantined, ap.Now()); a != nil {
			if err := ap.Issue(tx, nodeID, nodeproto.Command{Kind: nodeproto.KindStopWorkload, StopWorkload: &nodeproto.StopWorkloadCommand{
				WorkloadKey: nodeproto.WorkloadKey{RunID: run.ID, Attempt: a.Number}, Reason: api.AttemptFailureGPU, GracePeriod: 10 * time.Second}}); err != nil {
				return "", err
			}
			if _, err := ap.StopStrays(tx, &run.Run, nodeID); err != nil { // a gang's other members
				return "", err
			}
			ap.Log.Warn("attempt ended: its GPU went bad", "run", run.ID, "attempt", a.Number, "node", nodeID, "gpu", a.Failure.GPU, "reason", a.Failure.Reason)
			if e := EndedStatus(was, run.Status); e != "" {
				ended = e
			}
			filed = true
		}
		if filed {
			if err := tx.PutRun(run); err != nil {
				return "", err
			}
		}
	}
	return ended, nil
}

// StrayReason is the stop reason of stray attempt a (lifecycle.Strays):
// "replaced" for one replaced while its node was unreachable, "cancelled"
// and "gang" for a gang's members stopped because the run is being
// cancelled or another member ended, "superseded" for any other attempt of
// an ended run.
func StrayReason(run *api.Run, a *api.Attempt) string {
	switch {
	case a.Replaced:
		return "replaced"
	case lifecycle.Gang(run) && run.Cancel:
		return "cancelled"
	case lifecycle.Gang(run):
		return lifecycle.StopGang
	case api.Terminal(run.Status):
		return "superseded"
	}
	return "replaced"
}

// GraceOf is the time a run's container gets between SIGTERM and SIGKILL.
func GraceOf(r store.Run) time.Duration {
	if r.GraceSeconds > 0 {
		return time.Duration(r.GraceSeconds) * time.Second
	}
	return 10 * time.Second
}
