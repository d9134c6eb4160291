package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// A command's path through the agent, all of it in this file but the
// launch's steps (launch.go): the session loop hands it to dispatch; an
// invoke goes to a function worker and a call-log request is answered
// (functions.go, functions_logs.go), neither being an operation; every other
// command is an operation, and handle applies it at most once, under its
// workload's lock, retrying while the runtime is unavailable.

// dispatch routes one command from the session. It never blocks the
// session: operations run on their own goroutine.
func (a *Agent) dispatch(ctx context.Context, cmd nodeproto.Command) {
	switch cmd.Kind {
	case nodeproto.KindInvoke:
		a.invoke(ctx, cmd) // hands the call to a worker
	case nodeproto.KindCallLog:
		go a.answerCallLog(ctx, cmd)
	case nodeproto.KindHold:
		a.hold(cmd) // returns at once (functions_hold.go)
	default:
		go a.handle(ctx, cmd)
	}
}

// handle applies one operation at most once: a redelivered one is answered
// with the very result event it had, one fenced below this node's token is
// refused, and any other is applied (apply) and its result recorded as
// applied and spooled in one transaction, before anything reports it.
func (a *Agent) handle(ctx context.Context, cmd nodeproto.Command) {
	unlock := a.lockKey(commandKey(cmd))
	defer unlock()
	if ev, ok := a.state.AppliedResult(cmd.OperationID); ok {
		// Redelivered: answer with the very same event.
		if err := a.state.Spool(ev); err != nil {
			a.logger.Error("re-spool result", "op", cmd.OperationID, "err", err)
		}
		a.wakeFlush()
		return
	}
	result := nodeproto.Result{OperationID: cmd.OperationID, FencingToken: cmd.FencingToken, Kind: cmd.Kind}
	if held := a.state.FencingToken(); cmd.FencingToken < held {
		result.Outcome = nodeproto.OutcomeRefused
		result.Error = fmt.Sprintf("command fenced at token %d, below this node's token %d: it was issued to an enrollment that has been superseded", cmd.FencingToken, held)
	} else if err := a.applyRetrying(ctx, cmd, &result); err != nil {
		if ctx.Err() != nil {
			return // shutting down: the command will be redelivered
		}
		result.Outcome = nodeproto.OutcomeFailed
		result.Error = err.Error()
	} else {
		result.Outcome = nodeproto.OutcomeOK
	}
	result.At = a.now().UTC()
	id, err := a.state.NextEventID()
	if err != nil {
		a.logger.Error("mint event ID", "err", err)
		return
	}
	if err := a.state.MarkApplied(cmd.OperationID, nodeproto.Event{ID: id, Kind: nodeproto.EventResult, At: result.At, Result: &result}); err != nil {
		a.logger.Error("record applied operation", "op", cmd.OperationID, "err", err)
		return
	}
	a.logger.Info("applied", "op", cmd.OperationID, "kind", cmd.Kind, "outcome", result.Outcome, "error", result.Error)
	a.wakeObserve()
	a.wakeFlush()
}

// unavailableRetry bounds how long an operation is retried while the
// container runtime is unreachable (a daemon restart takes seconds). Past it,
// the failure is reported: a machine whose daemon stays down cannot do the
// work, and the run's retry policy decides what happens next.
const unavailableRetry = time.Minute

// applyRetrying applies a command, retrying while the failure is
// failure.ErrUnavailable (the daemon restarting, a registry briefly
// unreachable) rather than reporting a transient outage as the run's
// failure. Operations are idempotent on the runtime side (a launch adopts the
// container a previous try created), so retrying is safe.
func (a *Agent) applyRetrying(ctx context.Context, cmd nodeproto.Command, result *nodeproto.Result) error {
	deadline := a.now().Add(unavailableRetry)
	backoff := 250 * time.Millisecond
	for {
		err := a.apply(ctx, cmd, result)
		if err == nil || !errors.Is(err, failure.ErrUnavailable) || !a.now().Before(deadline) {
			return err
		}
		a.logger.Warn("runtime unavailable; retrying operation", "op", cmd.OperationID, "kind", cmd.Kind, "err", err, "in", backoff)
		if !sleep(ctx, backoff) {
			return ctx.Err()
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// apply performs one operation on the runtime. A launch runs its prestart
// steps (launch.go); the others are one runtime call each.
func (a *Agent) apply(ctx context.Context, cmd nodeproto.Command, result *nodeproto.Result) error {
	switch cmd.Kind {
	case nodeproto.KindPrepareImage:
		if cmd.PrepareImage == nil {
			return failure.Invalid("prepare_image", "command carries no payload")
		}
		return a.runtime.PrepareImage(ctx, *cmd.PrepareImage)
	case nodeproto.KindPrepareArtifact:
		if cmd.PrepareArtifact == nil {
			return failure.Invalid("prepare_artifact", "command carries no payload")
		}
		return a.runtime.PrepareArtifact(ctx, *cmd.PrepareArtifact)
	case nodeproto.KindLaunchWorkload:
		l := cmd.LaunchWorkload
		if l == nil {
			return failure.Invalid("launch_workload", "command carries no payload")
		}
		result.Workload = &l.WorkloadKey
		if err := a.checkSecrets(ctx, *l); err != nil {
			return err
		}
		return a.launch(ctx, *l)
	case nodeproto.KindStopWorkload:
		s := cmd.StopWorkload
		if s == nil {
			return failure.Invalid("stop_workload", "command carries no payload")
		}
		result.Workload = &s.WorkloadKey
		if s.Reason != "" {
			if err := a.state.RecordStop(s.WorkloadKey, s.Reason); err != nil {
				return err
			}
		}
		return a.runtime.StopWorkload(ctx, *s)
	case nodeproto.KindUpgradeAgent:
		if cmd.UpgradeAgent == nil {
			return failure.Invalid("upgrade_agent", "command carries no payload")
		}
		if a.upgrader == nil {
			return failure.Invalid("upgrade_agent", "this agent was started without self-upgrade (it cannot replace its own binary; one in the control plane's process, mercator server --local-agent, is upgraded with the server)")
		}
		return a.upgrader.Upgrade(ctx, cmd.OperationID, *cmd.UpgradeAgent)
	}
	return failure.Invalid("kind", "unknown command kind %q (this agent speaks capability version %d)", cmd.Kind, nodeproto.Version)
}

// checkSecrets refuses a launch that names secrets it carries no value
// for (the control plane could not open them) unless its container already
// exists: one an earlier delivery made before the agent restarted, which
// the launch then adopts as any redelivered launch does, so the refusal
// never leaves that container running behind a failed attempt. Called
// under the workload's lock, so no other launch of it creates it meanwhile.
func (a *Agent) checkSecrets(ctx context.Context, l nodeproto.LaunchWorkloadCommand) error {
	missing := l.MissingSecrets()
	if len(missing) == 0 {
		return nil
	}
	obs, err := a.runtime.Observe(ctx)
	if err != nil {
		return err
	}
	for _, o := range obs {
		if o.WorkloadKey == l.WorkloadKey && o.Phase != nodeproto.PhaseMissing {
			return nil
		}
	}
	return failure.Invalid("launch_workload", "the launch names the secrets %s but carries no value for them (the control plane could not open them; its log says why), so the container was not created", strings.Join(missing, ", "))
}

// lockKey serializes operations on one workload (a launch and its stop) while
// letting different workloads proceed in parallel.
func (a *Agent) lockKey(key string) func() {
	a.mu.Lock()
	l, ok := a.keyLocks[key]
	if !ok {
		l = &sync.Mutex{}
		a.keyLocks[key] = l
	}
	a.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func commandKey(cmd nodeproto.Command) string {
	switch {
	case cmd.LaunchWorkload != nil:
		return fmt.Sprintf("w/%s/%d", cmd.LaunchWorkload.RunID, cmd.LaunchWorkload.Attempt)
	case cmd.StopWorkload != nil:
		return fmt.Sprintf("w/%s/%d", cmd.StopWorkload.RunID, cmd.StopWorkload.Attempt)
	}
	return "op/" + cmd.OperationID
}
