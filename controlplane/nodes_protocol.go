package controlplane

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/access"
	"github.com/mercator/mercator/controlplane/internal/factcheck"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/internal/nodereport"
	"github.com/mercator/mercator/controlplane/internal/retention"
	"github.com/mercator/mercator/controlplane/internal/txrecord"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/store"
)

// enroll spends a single-use invitation and returns a session credential and
// a fencing token above any the node held before. Pending operations for the
// node are re-issued under the new token: they were never acknowledged, the
// new enrollment is now the only one that may perform them, and the
// container name derived from run and attempt makes performing one that the
// old enrollment already started an adoption rather than a duplicate.
func (s *Server) enroll(w http.ResponseWriter, r *http.Request) {
	var req nodeproto.EnrollmentRequest
	if err := httpapi.Decode(r, httpapi.MaxBody, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if req.Invitation == "" || req.NodeID == "" {
		httpapi.WriteError(w, failure.Invalid("invitation", "node_id and invitation are required"))
		return
	}
	httpapi.NoteWho(r.Context(), "node:"+req.NodeID, "node")
	now := s.now()
	tok := "mcs_" + httpapi.RandomToken()
	var out nodeproto.Enrollment
	// Locked (store.UpdateLocked): the invitation and the node are read
	// by key, locked and written back, so an invitation is spent once
	// however many enrollments race for it. The one list, the node's
	// pending operations, is read under the node's lock, which every
	// transaction adding an operation under the node's fencing token
	// holds until it commits (placements' GetNodes, issue's LockNode), so
	// none is left under the old token. Serializable, enrollments of
	// neighbouring nodes conflicted on shared index pages, each conflict
	// running a whole group of them again: on PostgreSQL a fleet enrolled
	// at a third of SQLite's rate.
	err := s.batchLocked(r.Context(), func(tx store.Tx) error {
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
		out = nodeproto.Enrollment{NodeID: n.ID, SessionToken: tok, ExpiresAt: now.Add(s.cfg.SessionTTL), FencingToken: n.FencingToken, Lease: s.cfg.Lease}
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

// renew issues a later credential for the caller's session and retires the
// one it replaces (access.RetireSessions): the caller's stays valid for
// access.RenewOverlap, so a renewal whose answer is lost can be retried with it,
// and every older one of the node's is deleted.
func (s *Server) renew(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	now := s.now()
	tok := "mcs_" + httpapi.RandomToken()
	out := nodeproto.SessionRenewal{SessionToken: tok, ExpiresAt: now.Add(s.cfg.SessionTTL), FencingToken: c.Session.FencingToken}
	renewed := store.Session{TokenHash: httpapi.HashToken(tok), NodeID: c.NodeID, FencingToken: c.Session.FencingToken, ExpiresAt: out.ExpiresAt, CreatedAt: now}
	err := s.batch(r.Context(), func(tx store.Tx) error { return access.RetireSessions(tx, c.Session, renewed, now) })
	if err != nil {
		s.auditNode(r, c.NodeID, api.StatusOf(err))
		httpapi.WriteError(w, err)
		return
	}
	s.auditNode(r, c.NodeID, http.StatusOK)
	s.fenceChanged(c.NodeID) // every replica drops the node's cached sessions
	s.live.Report(c.NodeID, now)
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// events applies a batch of node events, each at most once (deduplicated by
// node and event ID in the same transaction that applies it), and answers
// with the IDs the control plane now holds. An empty batch is a heartbeat:
// it is recorded in memory only (package liveness) and costs no transaction; a
// batch with events is committed together with concurrent ones (store_commit.go).
func (s *Server) events(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	var batch nodeproto.EventBatch
	if err := httpapi.DecodeBuffered(r, nodeproto.MaxEventBody, &batch); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.live.Report(c.NodeID, s.now())
	if len(batch.Events) == 0 {
		httpapi.WriteJSON(w, http.StatusOK, nodeproto.EventAck{Accepted: []string{}})
		return
	}
	need, err := newEventNeed(c.NodeID, batch.Events, s.now())
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	accepted := make([]string, 0, len(batch.Events))
	changedRuns := false
	applied := 0
	var ended []string // runs that became terminal, counted once committed
	var found []factcheck.Outcome
	// Locked (store.UpdateLocked): applying events reads the node, the
	// events' runs and operations by key and writes them back; whether an
	// event is fresh is decided by SeeEvents' insert, not by a read. A
	// batch whose facts name GPUs also reads the fleet (factcheck.Apply),
	// and is committed through store.Update instead. The batch's reads
	// are made together with those of the batches committed with it
	// (shareEvents), and tx is what they were read into.
	locked := !factcheck.ClaimsGPUs(batch)
	err = s.commits.UpdateWith(r.Context(), need, locked, func(tx store.Tx) error {
		accepted, changedRuns, applied, ended, found = accepted[:0], false, 0, ended[:0], found[:0]
		// Fenced again in the transaction that applies the events (with
		// the cached token when fresh, see nodes_auth.go), so a batch
		// authenticated before an enrollment that this replica has heard
		// of is refused.
		fence, err := s.fenceOf(tx, c.NodeID)
		if err != nil {
			return err
		}
		if fence > c.Session.FencingToken {
			return fencedError(c.NodeID, fence, c.Session.FencingToken)
		}
		for i, ev := range batch.Events {
			if need.fresh[i] {
				applied++
				changed, end, err := s.reports().Event(tx, c.NodeID, ev, &found)
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
		return s.watermarks.Advance(tx, c.NodeID, batch.Through) // why: retention/watermark.go
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	for _, status := range ended {
		s.metrics.Terminal.WithLabelValues(status).Inc()
	}
	factcheck.Report(s.log, s.metrics.FactFlags, c.NodeID, found)
	s.metrics.RecordGPUUsage(c.NodeID, batch)
	s.metrics.Events.WithLabelValues("applied").Add(float64(applied))
	s.metrics.Events.WithLabelValues("duplicate").Add(float64(len(accepted) - applied))
	if changedRuns {
		s.runsChanged()
		s.wakeReconcile()
	}
	httpapi.WriteJSON(w, http.StatusOK, nodeproto.EventAck{Accepted: accepted})
}

// eventNeed is what applying one node's event batch reads: which of its
// events are fresh (fresh, filled in by shareEvents) and the runs and
// operations those name.
type eventNeed struct {
	nodeID string
	events []nodeproto.Event
	ids    []string
	at     time.Time
	fresh  []bool
}

// newEventNeed refuses a batch with an event without an ID.
func newEventNeed(nodeID string, events []nodeproto.Event, at time.Time) (*eventNeed, error) {
	ids := make([]string, len(events))
	for i, ev := range events {
		if ev.ID == "" {
			return nil, failure.Invalid("events.id", "every event needs an ID")
		}
		ids[i] = ev.ID
	}
	return &eventNeed{nodeID: nodeID, events: events, ids: ids, at: at}, nil
}

// names appends the runs and operations the batch's fresh events name.
func (n *eventNeed) names(runs, ops []string) ([]string, []string) {
	for i, ev := range n.events {
		switch {
		case !n.fresh[i]:
		case ev.Kind == nodeproto.EventWorkload && ev.Workload != nil:
			runs = append(runs, ev.Workload.RunID)
		case ev.Kind == nodeproto.EventResult && ev.Result != nil:
			ops = append(ops, ev.Result.OperationID)
			if ev.Result.Workload != nil && ev.Result.Outcome != nodeproto.OutcomeOK { // a failed launch: its run is read
				runs = append(runs, ev.Result.Workload.RunID)
			}
		}
	}
	return runs, ops
}

// shareEvents is the control plane's groupcommit.Share, for the node event
// batches of one transaction (needs are *eventNeed): it records which of
// each batch's events are fresh (store.Tx.SeeEventBatches), then loads, locked in ID order, the runs and operations all the
// fresh ones name into one txrecord.Memo, one statement each for the whole
// group, which the batches are applied through and which is written back
// once (Flush), one statement for the runs and one for the operations.
// A batch cost about six statements of its own before; a group of them
// now costs about five in all on PostgreSQL.
func shareEvents(tx store.Tx, needs []any) (store.Tx, func() error, error) {
	memo := txrecord.NewMemo(tx)
	batches := make([]*eventNeed, len(needs))
	checks := make([]store.EventCheck, len(needs))
	for k, v := range needs {
		need, ok := v.(*eventNeed)
		if !ok {
			return nil, nil, fmt.Errorf("internal error: shareEvents was given a %T", v)
		}
		batches[k], checks[k] = need, store.EventCheck{NodeID: need.nodeID, EventIDs: need.ids, At: need.at}
	}
	fresh, err := memo.SeeEventBatches(checks)
	if err != nil {
		return nil, nil, err
	}
	var runs, ops []string
	for k, need := range batches {
		need.fresh = fresh[k]
		runs, ops = need.names(runs, ops)
	}
	if err := memo.LoadOperations(ops); err != nil {
		return nil, nil, err
	}
	if err := memo.Load(runs); err != nil {
		return nil, nil, err
	}
	return memo, memo.Flush, nil
}

// reports applies what nodes report to the records (package nodereport).
func (s *Server) reports() nodereport.Applier {
	return nodereport.Applier{Now: s.now, Log: s.log, Issue: s.issue}
}

// stopStrays issues a stop for every attempt of the run that may still be
// running but must not, and reports whether it issued any
// (nodereport.Applier.StopStrays).
func (s *Server) stopStrays(tx store.Tx, run *api.Run, nodeID string) (bool, error) {
	return s.reports().StopStrays(tx, run, nodeID)
}

// nodeLogs appends a chunk of a workload's output.
func (s *Server) nodeLogs(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	var chunk nodeproto.LogChunk
	if err := httpapi.Decode(r, nodeproto.MaxLogBody, &chunk); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	var size int64
	var truncated bool
	err := s.batch(r.Context(), func(tx store.Tx) error {
		run, err := tx.GetRun(chunk.RunID)
		if err != nil {
			return err
		}
		if a := lifecycle.Find(&run.Run, chunk.Attempt); a == nil || a.NodeID != c.NodeID {
			return failure.Conflict("run %s attempt %d is not on node %s", chunk.RunID, chunk.Attempt, c.NodeID)
		}
		size, truncated, err = retention.AppendCapped(tx, s.cfg.Retention.LogLimit(run.Run), chunk)
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if len(chunk.Data) > 0 {
		s.logsChanged()
	}
	httpapi.WriteJSON(w, http.StatusOK, nodeproto.LogAck{Size: size, Truncated: truncated})
}
