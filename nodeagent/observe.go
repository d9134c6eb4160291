package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// spoolWorkload owes the control plane an observation if it says something
// new.
func (a *Agent) spoolWorkload(o nodeproto.WorkloadObservation) {
	a.spoolObservation(o, false)
}

// spoolObservation spools o if it says something new, or, when onlyFirst,
// only if nothing at all was reported about its workload yet.
func (a *Agent) spoolObservation(o nodeproto.WorkloadObservation, onlyFirst bool) {
	if !a.state.WorkloadChanged(o) {
		return
	}
	id, err := a.state.NextEventID()
	if err != nil {
		a.logger.Error("mint event ID", "err", err)
		return
	}
	spooled, err := a.state.SpoolWorkload(nodeproto.Event{ID: id, Kind: nodeproto.EventWorkload, At: a.now().UTC(), Workload: &o}, o, onlyFirst)
	if err != nil {
		a.logger.Error("spool observation", "err", err)
		return
	}
	if spooled {
		a.wakeFlush()
	}
}

func (a *Agent) wakeFlush() {
	select {
	case a.flush <- struct{}{}:
	default:
	}
}

func (a *Agent) wakeObserve() {
	select {
	case a.observeCh <- struct{}{}:
	default:
	}
}

// observeLoop reads the daemon's view and spools what changed. It runs even
// while the control plane is unreachable: that is how a container that exits
// during a partition is reported afterwards with the daemon's own moments.
func (a *Agent) observeLoop(ctx context.Context) {
	t := time.NewTicker(a.observeEvery)
	defer t.Stop()
	var changes <-chan struct{}
	if src, ok := a.runtime.(ChangeSource); ok {
		changes = src.Changes(ctx)
	}
	for {
		a.observeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.observeCh:
		case <-changes:
		}
	}
}

func (a *Agent) observeOnce(ctx context.Context) {
	obs, err := a.runtime.Observe(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.logger.Warn("observe runtime", "err", err)
		}
		return
	}
	seen := map[nodeproto.WorkloadKey]bool{}
	for _, o := range obs {
		seen[o.WorkloadKey] = true
		o.StopReason = a.state.StopReason(o.WorkloadKey)
		if o.Phase == nodeproto.PhaseRunning && o.Timeout > 0 && o.StartedAt != nil && !a.now().Before(o.StartedAt.Add(o.Timeout)) && o.StopReason == "" {
			a.enforceTimeout(ctx, o)
		}
		shipped := a.shipLogs(ctx, o)
		if o.Phase == nodeproto.PhaseExited && shipped != nil && a.state.WorkloadChanged(o) {
			// Report the exit after the output it produced, so a client that
			// reads the logs of an ended run reads them whole. The wait is
			// bounded: a control plane that cannot take logs must not delay
			// the exit's report.
			select {
			case <-shipped:
			case <-time.After(5 * time.Second):
			case <-ctx.Done():
				return
			}
		}
		a.spoolWorkload(o)
	}
	// A workload the control plane was told about that the daemon no longer
	// knows: say so once, unless its end was already reported.
	for _, told := range a.state.Told() {
		if seen[told.WorkloadKey] || told.Phase == nodeproto.PhasePreparing {
			continue
		}
		if told.Phase == nodeproto.PhaseExited || told.Phase == nodeproto.PhaseMissing || told.Phase == nodeproto.PhaseFailed {
			continue
		}
		a.spoolWorkload(nodeproto.WorkloadObservation{WorkloadKey: told.WorkloadKey, ContainerID: told.ContainerID, Phase: nodeproto.PhaseMissing,
			Error: "the container is gone from the daemon without a recorded exit (removed by hand, or the daemon lost it)"})
	}
}

func (a *Agent) enforceTimeout(ctx context.Context, o nodeproto.WorkloadObservation) {
	if err := a.state.RecordStop(o.WorkloadKey, "timeout"); err != nil {
		a.logger.Error("record timeout", "err", err)
		return
	}
	a.logger.Info("timeout reached; stopping", "run", o.RunID, "attempt", o.Attempt, "timeout", o.Timeout)
	go func() {
		unlock := a.lockKey(fmt.Sprintf("w/%s/%d", o.RunID, o.Attempt))
		defer unlock()
		if err := a.runtime.StopWorkload(ctx, nodeproto.StopWorkloadCommand{WorkloadKey: o.WorkloadKey, Reason: "timeout", GracePeriod: 10 * time.Second}); err != nil {
			a.logger.Warn("stop timed-out workload", "err", err)
		}
		a.wakeObserve()
	}()
}

// shipLogs starts one shipper per workload whose output is not yet all
// delivered, and returns a channel closed when that shipper ends (nil when
// there is nothing to ship).
func (a *Agent) shipLogs(ctx context.Context, o nodeproto.WorkloadObservation) <-chan struct{} {
	src, ok := a.runtime.(LogSource)
	if !ok || o.ContainerID == "" || (o.Phase != nodeproto.PhaseRunning && o.Phase != nodeproto.PhaseExited) {
		// A container not yet started has no output to follow (and the
		// daemon would end the stream at once, as if it had exited).
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.shipped[o.WorkloadKey] {
		return nil
	}
	if done, ok := a.shipping[o.WorkloadKey]; ok {
		return done
	}
	done := make(chan struct{})
	a.shipping[o.WorkloadKey] = done
	go func() {
		defer close(done)
		complete := a.shipLogsOnce(ctx, src, o.WorkloadKey)
		a.mu.Lock()
		delete(a.shipping, o.WorkloadKey)
		if complete {
			a.shipped[o.WorkloadKey] = true
		}
		a.mu.Unlock()
	}()
	return done
}

// shipLogsOnce streams a workload's output from the start, skipping what
// the control plane acknowledges holding. It returns true once the stream
// ended (the container exited) and everything was delivered; false means
// the next observation should try again.
func (a *Agent) shipLogsOnce(ctx context.Context, src LogSource, key nodeproto.WorkloadKey) bool {
	rc, err := src.Logs(ctx, key, true)
	if err != nil {
		return false
	}
	defer rc.Close()
	buffer := newLogBuffer() // logship.go: a delivery carries all that arrived
	go buffer.fill(rc)
	defer buffer.stop()
	var offset int64
	var chunk []byte
	for {
		var rerr error
		chunk, rerr = buffer.take(chunk)
		if n := len(chunk); n > 0 {
			nodeID, tok := a.creds()
			ack, err := a.transport.SendLogs(ctx, nodeID, tok, nodeproto.LogChunk{WorkloadKey: key, Offset: offset, Data: chunk})
			if err != nil {
				return false
			}
			offset += int64(n)
			if ack.Truncated {
				return true // the log reached its cap: the rest would be dropped
			}
		}
		if rerr != nil {
			return errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF)
		}
	}
}
