package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/node"
	"github.com/mercator/mercator/store"
)

// enroll spends a single-use invitation and returns a session credential and
// a fencing token above any the node held before. Pending operations for the
// node are re-issued under the new token: they were never acknowledged, the
// new enrollment is now the only one that may perform them, and the
// container name derived from run and attempt makes performing one that the
// old enrollment already started an adoption rather than a duplicate.
func (s *Server) enroll(w http.ResponseWriter, r *http.Request) {
	var req capability.EnrollmentRequest
	if err := httpapi.Decode(r, httpapi.MaxBody, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if req.Invitation == "" || req.NodeID == "" {
		httpapi.WriteError(w, failure.Invalid("invitation", "node_id and invitation are required"))
		return
	}
	now := s.now()
	tok := "mcs_" + httpapi.RandomToken()
	var out capability.Enrollment
	err := s.batch(r.Context(), func(tx store.Tx) error {
		inv, err := tx.GetInvitation(httpapi.HashToken(req.Invitation))
		if errors.Is(err, failure.ErrNotFound) || (err == nil && inv.NodeID != req.NodeID) {
			return failure.Unauthorized("invitation not recognised for node %q; create one with `mercator node invite %s`", req.NodeID, req.NodeID)
		}
		if err != nil {
			return err
		}
		if inv.SpentAt != nil {
			return failure.Unauthorized("invitation for node %q was already used at %s; invitations are single-use: create a new one with `mercator node invite %s`", req.NodeID, inv.SpentAt.Format(time.RFC3339), req.NodeID)
		}
		if !inv.ExpiresAt.After(now) {
			return failure.Unauthorized("invitation for node %q expired at %s; create a new one with `mercator node invite %s`", req.NodeID, inv.ExpiresAt.Format(time.RFC3339), req.NodeID)
		}
		inv.SpentAt = &now
		if err := tx.PutInvitation(inv); err != nil {
			return err
		}
		n, err := tx.GetNode(req.NodeID)
		if err != nil {
			return err
		}
		n.FencingToken++
		n.EnrolledAt, n.LastSeenAt = &now, &now
		n.AgentVersion, n.Capability = req.AgentVersion, req.CapabilityVersion
		if err := tx.PutNode(n); err != nil {
			return err
		}
		ops, err := tx.PendingOperations(n.ID)
		if err != nil {
			return err
		}
		for _, op := range ops {
			op.Command.FencingToken = n.FencingToken
			if err := tx.PutOperation(op); err != nil {
				return err
			}
		}
		out = capability.Enrollment{NodeID: n.ID, SessionToken: tok, ExpiresAt: now.Add(s.cfg.SessionTTL), FencingToken: n.FencingToken, Lease: s.cfg.Lease}
		return tx.PutSession(store.Session{TokenHash: httpapi.HashToken(tok), NodeID: n.ID, FencingToken: n.FencingToken, ExpiresAt: out.ExpiresAt, CreatedAt: now})
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.live.Report(req.NodeID, now)
	s.log.Info("node enrolled", "node", req.NodeID, "fencing_token", out.FencingToken, "agent_version", req.AgentVersion)
	s.fenceChanged(req.NodeID) // an older session's stream must notice it is fenced
	s.wakeReconcile()
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// renew issues a later credential for the caller's session. The old one
// stays valid until its own expiry, so a renewal whose answer is lost costs
// nothing.
func (s *Server) renew(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	now := s.now()
	tok := "mcs_" + httpapi.RandomToken()
	out := capability.SessionRenewal{SessionToken: tok, ExpiresAt: now.Add(s.cfg.SessionTTL), FencingToken: c.Session.FencingToken}
	err := s.batch(r.Context(), func(tx store.Tx) error {
		return tx.PutSession(store.Session{TokenHash: httpapi.HashToken(tok), NodeID: c.NodeID, FencingToken: c.Session.FencingToken, ExpiresAt: out.ExpiresAt, CreatedAt: now})
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.live.Report(c.NodeID, now)
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// sessionPoll is how many keep-alives a session stream sends between reads
// of the store when nothing wakes it (30 s at the default keep-alive).
const sessionPoll = 3

// keepAliveLine is a keep-alive as the stream carries it, encoded once.
var keepAliveLine = func() []byte {
	b, err := json.Marshal(node.Command{Kind: node.KindKeepAlive})
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}()

// session streams the node's pending operations as newline-delimited JSON,
// each once per stream, with keep-alives, until the client goes away or the
// session is fenced. Every new stream starts by sending everything still
// pending: that is the redelivery.
func (s *Server) session(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	ctx := r.Context()
	flusher, ok := w.(http.Flusher)
	if !ok {
		httpapi.WriteError(w, fmt.Errorf("streaming unsupported"))
		return
	}
	s.live.Report(c.NodeID, s.now())
	live := s.streams.attach(c.NodeID, c.Session.FencingToken, r) // nodes_live.go: calls go straight down
	defer s.streams.detach(live)
	s.fn.NodesChanged() // read the fleet again: a node is back
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	s.log.Info("session opened", "node", c.NodeID, "fencing_token", c.Session.FencingToken)
	defer s.log.Info("session closed", "node", c.NodeID)
	s.metrics.sessions.Inc()
	defer s.metrics.sessions.Dec()
	st := &sessionStream{w: w, flusher: flusher, enc: json.NewEncoder(w), sent: map[string]bool{}, live: live}
	st.mb = s.attachInbox(c.NodeID) // before the first read: nothing falls between
	defer st.mb.detach()
	wake := s.nodeBroadcast(c.NodeID)
	st.keep = time.NewTicker(s.cfg.KeepAlive)
	defer st.keep.Stop()
	sweep := true
	for {
		woken := wake.Wait()
		ops, strays, ok := s.sessionRead(ctx, c, sweep)
		if !ok {
			return
		}
		if sweep {
			sweep = false
			if strays {
				if err := s.update(ctx, func(tx store.Tx) error { return s.sweepStraysTx(tx, c.NodeID) }); err != nil {
					return
				}
				continue // the stops it issued are pending now: read again
			}
		}
		for _, op := range ops {
			if !s.sendOnce(ctx, st, op.ID, op.Command) {
				return
			}
		}
		flusher.Flush()
		if !s.sessionWait(ctx, st, woken) {
			return
		}
	}
}

// sessionStream is one session stream's sending side: what it has sent
// (each operation once per stream), and where more comes from besides the
// store (the mailbox, the live session's ephemeral commands).
type sessionStream struct {
	w       http.ResponseWriter
	flusher http.Flusher
	enc     *json.Encoder
	sent    map[string]bool // operation IDs
	mb      *inbox
	live    *liveSession
	keep    *time.Ticker
}

// sendOnce writes operation id's command as it is sent (outbound: reads
// minted, credentials attached) unless this stream already sent it; false
// when the stream broke.
func (s *Server) sendOnce(ctx context.Context, st *sessionStream, id string, cmd node.Command) bool {
	if st.sent[id] {
		return true
	}
	if err := st.enc.Encode(s.outbound(ctx, cmd)); err != nil {
		return false
	}
	st.sent[id] = true
	return true
}

// sessionRead reads the node's pending operations and, on the first read
// (sweep), whether it runs strays; ok is false when the stream must end
// (the store failed, or the session is fenced).
func (s *Server) sessionRead(ctx context.Context, c httpapi.NodeCaller, sweep bool) (ops []store.Operation, strays, ok bool) {
	fenced := false
	err := s.store.View(ctx, func(tx store.Tx) error {
		fence, err := s.fenceOf(tx, c.NodeID)
		if err != nil {
			return err
		}
		fenced = fence > c.Session.FencingToken
		if sweep {
			// The first read also looks for strays (hasStrays), so a
			// fleet reconnecting costs one read per session.
			if strays, err = s.hasStrays(tx, c.NodeID); err != nil {
				return err
			}
		}
		ops, err = tx.PendingOperations(c.NodeID)
		return err
	})
	return ops, strays, err == nil && !fenced
}

// sessionWait sends what arrives without a store read (operations handed
// over by the mailbox, ephemeral commands, keep-alives) until the stream
// should read the store again: true once woken (or after sessionPoll
// keep-alives, with several replicas), false when the stream ended.
func (s *Server) sessionWait(ctx context.Context, st *sessionStream, woken <-chan struct{}) bool {
	idle := 0 // keep-alives since the store was last read
	for {
		select {
		case <-ctx.Done():
			return false
		case <-woken:
			return true
		case <-st.keep.C:
			if _, err := st.w.Write(keepAliveLine); err != nil {
				return false
			}
			st.flusher.Flush()
			// A wake is what sends new operations; reading the store
			// every few keep-alives too covers a wake that was lost (a
			// signal from another replica dropped), without making ten
			// thousand idle streams read it every keep-alive. A replica
			// alone hears every signal from itself, and does not read.
			if idle++; idle >= sessionPoll && s.coord != nil {
				return true
			}
		case <-st.mb.notify:
			// Committed here and handed over: no store read follows.
			for _, cmd := range st.mb.take() {
				if !s.sendOnce(ctx, st, cmd.OperationID, cmd) {
					return false
				}
			}
			st.flusher.Flush()
		case cmd := <-st.live.cmds:
			// An invoke is not an operation: no store read follows it.
			if st.live.forward(st.enc, st.flusher, cmd) != nil {
				return false
			}
		}
	}
}

// events applies a batch of node events, each at most once (deduplicated by
// node and event ID in the same transaction that applies it), and answers
// with the IDs the control plane now holds. An empty batch is a heartbeat:
// it is recorded in memory only (package liveness) and costs no transaction; a
// batch with events is committed together with concurrent ones (commit.go).
func (s *Server) events(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	var batch node.EventBatch
	if err := httpapi.Decode(r, maxLogBody, &batch); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.live.Report(c.NodeID, s.now())
	if len(batch.Events) == 0 {
		httpapi.WriteJSON(w, http.StatusOK, node.EventAck{Accepted: []string{}})
		return
	}
	accepted := make([]string, 0, len(batch.Events))
	changedRuns := false
	applied := 0
	var ended []string // runs that became terminal, counted once committed
	// Locked (store.UpdateLocked): applying events reads the node, the
	// events' runs and operations by key and writes them back; whether an
	// event is fresh is decided by SeeEvent's insert, not by a read.
	err := s.batchLocked(r.Context(), func(tx store.Tx) error {
		accepted, changedRuns, applied, ended = accepted[:0], false, 0, ended[:0]
		// Fenced again in the transaction that applies the events (with
		// the cached token when fresh, see authcache.go), so a batch
		// authenticated before an enrollment that this replica has heard
		// of is refused.
		fence, err := s.fenceOf(tx, c.NodeID)
		if err != nil {
			return err
		}
		if fence > c.Session.FencingToken {
			return fencedError(c.NodeID, fence, c.Session.FencingToken)
		}
		tx = newRunMemo(tx) // events about one run: one read, one write
		for _, ev := range batch.Events {
			if ev.ID == "" {
				return failure.Invalid("events.id", "every event needs an ID")
			}
			fresh, err := tx.SeeEvent(c.NodeID, ev.ID, s.now())
			if err != nil {
				return err
			}
			if fresh {
				applied++
				changed, end, err := s.applyEvent(tx, c.NodeID, ev)
				if end != "" {
					ended = append(ended, end)
				}
				if err != nil {
					return fmt.Errorf("event %s: %w", ev.ID, err)
				}
				changedRuns = changedRuns || changed
			}
			accepted = append(accepted, ev.ID)
		}
		return tx.(*runMemo).flush()
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	for _, status := range ended {
		s.metrics.terminal.WithLabelValues(status).Inc()
	}
	s.metrics.events.WithLabelValues("applied").Add(float64(applied))
	s.metrics.events.WithLabelValues("duplicate").Add(float64(len(accepted) - applied))
	if changedRuns {
		s.runsChanged()
		s.wakeReconcile()
	}
	httpapi.WriteJSON(w, http.StatusOK, node.EventAck{Accepted: accepted})
}

// applyEvent applies one fresh event inside tx and reports whether a run
// changed and, when a run became terminal, its new status.
func (s *Server) applyEvent(tx store.Tx, nodeID string, ev node.Event) (changed bool, ended string, err error) {
	now := s.now()
	switch ev.Kind {
	case node.EventFacts:
		if ev.Facts == nil {
			return false, "", nil
		}
		n, err := tx.GetNode(nodeID)
		if err != nil {
			return false, "", err
		}
		n.Facts, n.FactsAt = ev.Facts, &now
		return true, "", tx.PutNode(n) // capacity changed: placements may now fit
	case node.EventWorkload:
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
		stopped, err := s.stopStrays(tx, &run.Run, nodeID)
		if err != nil {
			return false, "", err
		}
		if !changed && !stopped {
			return false, "", nil
		}
		return true, endedStatus(was, run.Status), tx.PutRun(run)
	case node.EventResult:
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
		if res.Outcome == node.OutcomeOK || res.Workload == nil || op.Command.Kind != node.KindLaunchWorkload {
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
		return true, endedStatus(was, run.Status), tx.PutRun(run)
	}
	return false, "", nil // an event kind from a newer agent: held, not applied
}

// stopStrays issues a stop for every attempt of the run on this node that
// may still be running but must not (see lifecycle.Strays), and reports
// whether it issued any. It is called when a node reports on a run, which is
// when a replaced attempt on a returning node shows itself.
func (s *Server) stopStrays(tx store.Tx, run *api.Run, nodeID string) (bool, error) {
	issued := false
	for _, a := range lifecycle.Strays(run) {
		if a.NodeID != nodeID {
			continue
		}
		reason := "replaced"
		if api.Terminal(run.Status) && !a.Replaced {
			reason = "superseded"
		}
		if err := s.issue(tx, nodeID, node.Command{Kind: node.KindStopWorkload, StopWorkload: &capability.StopWorkloadCommand{
			WorkloadKey: capability.WorkloadKey{RunID: run.ID, Attempt: a.Number}, Reason: reason, GracePeriod: 10 * time.Second}}); err != nil {
			return false, err
		}
		a.StopRequested = true
		issued = true
		s.log.Info("stopping stray attempt", "run", run.ID, "attempt", a.Number, "node", nodeID, "reason", reason)
	}
	return issued, nil
}

// sweepStraysTx stops the node's stray attempts when it opens a session. A
// node returning from a partition or a restart may hold an attempt that was
// replaced meanwhile and say nothing new about it (its container is running,
// as it was when last reported), so the control plane cannot wait for an
// observation to notice it.
//
// The session stream looks for strays in its first read (hasStrays) and
// takes a write transaction (sweepStraysTx) only when there is one: a fleet
// reconnecting (after a restart of the control plane, or of a replica) must
// not queue ten thousand empty write transactions on the store's writer.
func (s *Server) hasStrays(tx store.Tx, nodeID string) (bool, error) {
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

func (s *Server) sweepStraysTx(tx store.Tx, nodeID string) error {
	runs, err := tx.ListRuns(store.ListRunsOptions{NodeID: nodeID})
	if err != nil {
		return err
	}
	for _, run := range runs {
		stopped, err := s.stopStrays(tx, &run.Run, nodeID)
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

// endedStatus is the new status when a run just became terminal, else "".
func endedStatus(was, now string) string {
	if !api.Terminal(was) && api.Terminal(now) {
		return now
	}
	return ""
}

// nodeLogs appends a chunk of a workload's output.
func (s *Server) nodeLogs(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	var chunk capability.LogChunk
	if err := httpapi.Decode(r, maxLogBody, &chunk); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	var size int64
	err := s.batch(r.Context(), func(tx store.Tx) error {
		run, err := tx.GetRun(chunk.RunID)
		if err != nil {
			return err
		}
		if a := lifecycle.Find(&run.Run, chunk.Attempt); a == nil || a.NodeID != c.NodeID {
			return failure.Conflict("run %s attempt %d is not on node %s", chunk.RunID, chunk.Attempt, c.NodeID)
		}
		size, err = tx.AppendLog(chunk.WorkloadKey, chunk.Offset, chunk.Data)
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if len(chunk.Data) > 0 {
		s.logsChanged()
	}
	httpapi.WriteJSON(w, http.StatusOK, capability.LogAck{Size: size})
}
