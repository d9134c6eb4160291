// Package lifecycle is the run state machine: how a run and its attempts
// move when a node reports something, when a launch fails, when a user
// cancels. It is pure logic over api.Run values, with the moment passed in;
// the control plane does the I/O around it (reading and writing the store,
// issuing operations).
//
// A run's status is driven only by what a node observed or reported, never
// by a guess: a run is "running" because the daemon said its container
// started, and it ends because the daemon said the container exited.
//
// Only the control plane imports lifecycle.
package lifecycle

import (
	"fmt"
	"slices"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

// Active reports whether an attempt still holds (or may hold) resources on
// its node.
func Active(a api.Attempt) bool {
	switch a.Status {
	case api.AttemptPlaced, api.AttemptPreparing, api.AttemptRunning, api.AttemptUnknown:
		return true
	}
	return false
}

// Current returns the run's latest attempt, or nil.
func Current(r *api.Run) *api.Attempt {
	if len(r.Attempts) == 0 {
		return nil
	}
	return &r.Attempts[len(r.Attempts)-1]
}

// Find returns the attempt with the given number, or nil.
func Find(r *api.Run, number int) *api.Attempt {
	for i := range r.Attempts {
		if r.Attempts[i].Number == number {
			return &r.Attempts[i]
		}
	}
	return nil
}

// Place records a new attempt of a queued run on a node, holding the given
// GPUs (by UUID).
func Place(r *api.Run, nodeID string, gpus []string, now time.Time) api.Attempt {
	a := api.Attempt{Number: len(r.Attempts) + 1, NodeID: nodeID, GPUs: gpus, Status: api.AttemptPlaced, PlacedAt: now}
	r.Attempts = append(r.Attempts, a)
	r.Status = api.RunPlaced
	r.Reason = ""
	r.UpdatedAt = now
	return a
}

// Observe applies a node's observation of one attempt. It returns whether
// the run changed. An observation from a node that does not hold the attempt
// changes nothing, and one for an attempt already settled only fills in
// moments that were missing.
func Observe(r *api.Run, nodeID string, o nodeproto.WorkloadObservation, now time.Time) bool {
	a := Find(r, o.Attempt)
	if a == nil || a.NodeID != nodeID {
		return false
	}
	before := captureOutcome(r, a)
	recordUsage(a, o.GPUUsage) // gpu.go
	if o.ContainerID != "" {
		a.ContainerID = o.ContainerID
	}
	if o.StartedAt != nil {
		a.StartedAt = o.StartedAt
	}
	if o.FinishedAt != nil && o.Phase == nodeproto.PhaseExited {
		a.FinishedAt = o.FinishedAt
	}
	if !Active(*a) && a.Status != api.AttemptUnknown {
		return changed(before, r, a, now)
	}
	if o.Phase != nodeproto.PhasePreparing {
		a.Progress = nil // past preparing
	}
	switch o.Phase {
	case nodeproto.PhasePreparing, nodeproto.PhaseCreated:
		if a.Status == api.AttemptPlaced || a.Status == api.AttemptUnknown {
			a.Status = api.AttemptPreparing
		}
		if p := o.Progress; p != nil && o.Phase == nodeproto.PhasePreparing && a.Status == api.AttemptPreparing {
			a.Progress = &api.PrepareProgress{Step: p.Step, DoneBytes: max(p.DoneBytes, 0), TotalBytes: max(p.TotalBytes, 0)}
		}
	case nodeproto.PhaseRunning:
		a.Status = api.AttemptRunning
	case nodeproto.PhaseExited:
		code := 0
		if o.ExitCode != nil {
			code = *o.ExitCode
		}
		a.ExitCode = &code
		a.OOMKilled = o.OOMKilled
		a.StopReason = o.StopReason
		switch {
		case o.StopReason == "cancelled" || (r.Cancel && code != 0):
			a.Status = api.AttemptCancelled
		case code == 0 && o.StopReason == "":
			a.Status = api.AttemptSucceeded
		case a.PreemptedBy != "":
			a.Status = api.AttemptPreempted
		default:
			a.Status = api.AttemptFailed
			a.Error = exitError(r, code, o)
		}
	case nodeproto.PhaseFailed, nodeproto.PhaseMissing:
		a.Status = api.AttemptFailed
		if a.PreemptedBy != "" {
			a.Status = api.AttemptPreempted
		}
		a.Error = o.Error
		if a.FinishedAt == nil {
			t := now
			a.FinishedAt = &t
		}
	}
	settle(r, a, now)
	return changed(before, r, a, now)
}

// outcome is what Observe may change in a run: the observed attempt and the
// run's status and result. Observe compares it field by field (pointers by
// what they point to) rather than printing the run: an observation arrives
// with every node event, and printing a run twice for each was a fifth of
// the work of applying events at fleet scale.
type outcome struct {
	attempt    api.Attempt
	status     string
	reason     string
	exitCode   *int
	finishedAt *time.Time
}

func captureOutcome(r *api.Run, a *api.Attempt) outcome {
	return outcome{attempt: *a, status: r.Status, reason: r.Reason, exitCode: r.ExitCode, finishedAt: r.FinishedAt}
}

// changed reports whether r or a differ from before, and if so stamps r's
// UpdatedAt with now.
func changed(before outcome, r *api.Run, a *api.Attempt, now time.Time) bool {
	after := captureOutcome(r, a)
	if sameAttempt(before.attempt, after.attempt) && before.status == after.status && before.reason == after.reason &&
		sameInt(before.exitCode, after.exitCode) && sameTime(before.finishedAt, after.finishedAt) {
		return false
	}
	r.UpdatedAt = now
	return true
}

func sameAttempt(x, y api.Attempt) bool {
	return x.Number == y.Number && x.NodeID == y.NodeID && slices.Equal(x.GPUs, y.GPUs) && x.Status == y.Status &&
		x.ContainerID == y.ContainerID && sameInt(x.ExitCode, y.ExitCode) && x.OOMKilled == y.OOMKilled &&
		x.Error == y.Error && x.StopReason == y.StopReason && x.Replaced == y.Replaced &&
		x.StopRequested == y.StopRequested && x.PlacedAt.Equal(y.PlacedAt) &&
		sameTime(x.StartedAt, y.StartedAt) && sameTime(x.FinishedAt, y.FinishedAt) &&
		x.PreemptedBy == y.PreemptedBy && x.PreemptedFor == y.PreemptedFor && sameTime(x.PreemptedAt, y.PreemptedAt) &&
		(x.Progress == y.Progress || (x.Progress != nil && y.Progress != nil && *x.Progress == *y.Progress)) &&
		x.Failure == y.Failure && sameUsage(x.GPUUsage, y.GPUUsage) && len(x.Xids) == len(y.Xids) &&
		x.Set == y.Set && x.Rank == y.Rank
}

func sameInt(x, y *int) bool { return x == y || (x != nil && y != nil && *x == *y) }

func sameTime(x, y *time.Time) bool { return x == y || (x != nil && y != nil && x.Equal(*y)) }

func exitError(r *api.Run, code int, o nodeproto.WorkloadObservation) string {
	switch {
	case o.StopReason == "timeout":
		return fmt.Sprintf("timed out after %s and was stopped", (time.Duration(r.TimeoutSeconds) * time.Second).String())
	case o.OOMKilled:
		return fmt.Sprintf("killed for exceeding its memory limit (exit %d)", code)
	case o.StopReason != "":
		return fmt.Sprintf("stopped (%s), exit %d", o.StopReason, code)
	}
	return fmt.Sprintf("exited with code %d", code)
}

// LaunchFailed applies a launch the node could not perform (the image could
// not be pulled, the container could not start).
func LaunchFailed(r *api.Run, nodeID string, attempt int, message string, now time.Time) bool {
	a := Find(r, attempt)
	if a == nil || a.NodeID != nodeID || !Active(*a) {
		return false
	}
	a.Status = api.AttemptFailed
	a.Error = message
	t := now
	a.FinishedAt = &t
	settle(r, a, now)
	r.UpdatedAt = now
	return true
}

// settle moves the run after its attempt a changed.
func settle(r *api.Run, a *api.Attempt, now time.Time) {
	if Gang(r) {
		settleGang(r, a, now) // gang.go
		return
	}
	if cur := Current(r); cur == nil || cur.Number != a.Number || api.Terminal(r.Status) {
		return
	}
	switch a.Status {
	case api.AttemptPreparing:
		r.Status = api.RunPreparing
	case api.AttemptRunning:
		r.Status = api.RunRunning
	case api.AttemptSucceeded:
		finish(r, api.RunSucceeded, "", a.ExitCode, now)
	case api.AttemptCancelled:
		finish(r, api.RunCancelled, "cancelled by request", a.ExitCode, now)
	case api.AttemptPreempted:
		if r.Cancel {
			finish(r, api.RunCancelled, "cancelled by request", a.ExitCode, now)
			return
		}
		r.Status = api.RunQueued
		r.Reason = fmt.Sprintf("attempt %d %s; queued again (no retry spent)", a.Number, a.PreemptedBy)
	case api.AttemptFailed:
		if r.Cancel {
			finish(r, api.RunCancelled, "cancelled by request", a.ExitCode, now)
			return
		}
		if spent := Spent(r); spent <= r.Retries && a.StopReason != "timeout" {
			r.Status = api.RunQueued
			r.Reason = fmt.Sprintf("attempt %d failed (%s); retrying (%d of %d retries used)", a.Number, a.Error, spent, r.Retries)
			if spent < len(r.Attempts) {
				r.Reason += fmt.Sprintf("; %d attempts ended by a bad GPU or preempted did not count", len(r.Attempts)-spent)
			}
			return
		}
		finish(r, api.RunFailed, fmt.Sprintf("attempt %d %s", a.Number, a.Error), a.ExitCode, now)
	}
}

func finish(r *api.Run, status, reason string, code *int, now time.Time) {
	r.Status = status
	r.Reason = reason
	r.ExitCode = code
	t := now
	r.FinishedAt = &t
}

// DefaultReplaceAfter is how long an attempt's node may be unreachable (past
// its lease) before the attempt is replaced, when the run does not say. Five
// minutes rides out a reboot or a network blip on a rented machine without
// paying for a second copy of the work, and bounds how long a lost machine
// holds a run up.
const DefaultReplaceAfter = 5 * time.Minute

// ReplaceAfter is the run's replace-after policy; ok is false for "never".
func ReplaceAfter(r *api.Run) (d time.Duration, ok bool) {
	switch {
	case r.ReplaceAfterSeconds < 0:
		return 0, false
	case r.ReplaceAfterSeconds == 0:
		return DefaultReplaceAfter, true
	}
	return time.Duration(r.ReplaceAfterSeconds) * time.Second, true
}

// Replace gives up on the run's current attempt because its node has been
// unreachable since the given moment: the attempt is marked replaced (its
// status stays what was last known, since nothing was observed) and the run
// goes back to the queue for a new attempt elsewhere. It returns the
// replaced attempt, or nil when there is nothing to replace.
func Replace(r *api.Run, unreachableSince, now time.Time) *api.Attempt {
	a := Current(r)
	if a == nil || !Active(*a) || a.Replaced || api.Terminal(r.Status) || r.Cancel {
		return nil
	}
	a.Replaced = true
	r.Status = api.RunQueued
	r.Reason = fmt.Sprintf("attempt %d replaced: node %s unreachable since %s", a.Number, a.NodeID, unreachableSince.UTC().Format(time.RFC3339))
	r.UpdatedAt = now
	return a
}

// Strays returns the attempts that may still run but must not: a replaced
// attempt, any attempt of an ended run, any attempt but the current one. The
// control plane stops each once (it sets StopRequested), which is what keeps
// at most one attempt of a run running once an unreachable node is back.
// A gang's strays are every member of a set that is not current or that
// broke, and all its members while it is being cancelled (gang.go).
func Strays(r *api.Run) []*api.Attempt {
	var out []*api.Attempt
	cur := Current(r)
	for i := range r.Attempts {
		a := &r.Attempts[i]
		if !Active(*a) || a.StopRequested {
			continue
		}
		stray := a != cur
		if Gang(r) {
			stray = gangStray(r, a) || r.Cancel
		}
		if stray || a.Replaced || api.Terminal(r.Status) {
			out = append(out, a)
		}
	}
	return out
}

// Cancel marks a run cancelled on request. It returns the attempt that must
// be stopped on its node, or nil when nothing runs and the run ended here.
// Cancelling an ended run changes nothing. A gang's other active members
// are strays from here on (Strays), stopped by the caller too.
func Cancel(r *api.Run, now time.Time) *api.Attempt {
	if api.Terminal(r.Status) {
		return nil
	}
	r.Cancel = true
	r.UpdatedAt = now
	for _, a := range Members(r) {
		if Active(*a) {
			return a
		}
	}
	finish(r, api.RunCancelled, "cancelled by request", nil, now)
	return nil
}

// Spent is how many of a run's attempts count against its retries: all but
// the preempted ones, which were stopped for someone else's sake, and those
// ended by a bad GPU (up to maxExcusedGPUFailures of them: gpu.go), which
// were the machine's fault.
func Spent(r *api.Run) int {
	n, excused := 0, 0
	for _, a := range r.Attempts {
		switch {
		case a.Status == api.AttemptPreempted:
		case a.Failure != nil && a.Failure.Kind == api.AttemptFailureGPU && excused < maxExcusedGPUFailures:
			excused++
		default:
			n++
		}
	}
	return n
}

// Preempt marks a run's active attempt as stopped to make room for other
// work, with who and why (why is the sentence, key the reason's word, as
// the scheduler gives them). It returns the attempt, whose stop the caller
// issues, or nil when the attempt is no longer active or already stopping
// (the plan was made on an older snapshot). The attempt ends preempted
// when its node reports the exit, and the run is queued again then.
func Preempt(r *api.Run, attempt int, why, key string, now time.Time) *api.Attempt {
	a := Find(r, attempt)
	if a == nil || !Active(*a) || a.StopRequested || r.Cancel || api.Terminal(r.Status) {
		return nil
	}
	a.StopRequested = true
	a.PreemptedBy, a.PreemptedFor = why, key
	t := now
	a.PreemptedAt = &t
	r.Reason = "stopping: " + why
	r.UpdatedAt = now
	return a
}
