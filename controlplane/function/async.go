package function

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/callkind"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/supervise"
	"github.com/mercator/mercator/store"
)

// Durable calls: Fn's detached invoke (Fn-Invoke-Type: detached) and
// Mercator's /invoke/{fn_id}/async. The call, its request included, is
// stored before the caller hears 202, and every replica's dispatcher
// delivers due calls through the same placement as synchronous ones,
// buffering the response into the call's record with the output the node
// kept for it.
//
// Delivery is at least once. A dispatcher claims a call in a transaction
// (status running, a claim ID, and a lease: Due moves to the end of the
// call's deadline plus asyncLeaseGrace), so two dispatchers never run it
// at once; a dispatcher that dies holding a claim lets the lease lapse and
// the call becomes due again, and one that stops cleanly hands its claims
// back at once. Only the holder of the current claim records an outcome.
// A call whose node was lost, or that found no node free, is queued again
// with a backoff, up to asyncMaxAttempts deliveries; an error that is the
// function's (it failed, timed out, ran out of memory) is its outcome, as
// in Fn. The function sees the call's ID (Fn-Call-Id) on every delivery,
// which is how it can tell a redelivery.

const (
	asyncPoll        = 500 * time.Millisecond
	asyncParallel    = 64
	asyncMaxAttempts = 5
	asyncLeaseGrace  = 5 * time.Second
)

// enqueue stores a durable call for the function and answers 202 with its
// ID.
func (s *Service) enqueue(w http.ResponseWriter, r *http.Request, e *fnEntry, header http.Header) {
	body, err := io.ReadAll(io.LimitReader(r.Body, api.FnMaxRequestBytes+1))
	if err != nil {
		writeFnError(w, http.StatusBadRequest, "Invalid payload")
		return
	}
	if len(body) > api.FnMaxRequestBytes {
		writeFnJSON(w, http.StatusRequestEntityTooLarge, api.FnError{Message: "Request content too large", Kind: "request_too_big"})
		return
	}
	now := s.now()
	call := store.Call{FnCall: api.FnCall{ID: httpapi.NewID("call-"), Status: api.CallQueued, AppID: e.fn.AppID, FnID: e.fn.ID, CreatedAt: now},
		Header: header, Body: body, Due: now}
	if err := s.store.Update(r.Context(), func(tx store.Tx) error { return tx.CreateCall(call) }); err != nil {
		s.fnFail(w, err)
		return
	}
	s.metrics.durable.WithLabelValues(e.fn.ID, "enqueued").Inc()
	s.wake()
	w.Header().Set("Fn-Call-Id", call.ID)
	writeFnJSON(w, http.StatusAccepted, api.DetachedCall{CallID: call.ID})
}

func (s *Service) wake() {
	select {
	case s.wakeAsync <- struct{}{}:
	default:
	}
}

// StartAsync runs the service's loops under sup (each restarted after a
// panic): asyncLoop, which delivers durable calls, and warmLoop, which
// keeps warm capacity (warm.go). The channel is closed once both
// returned.
func (s *Service) StartAsync(ctx context.Context, sup supervise.Supervisor) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if s == nil {
			return
		}
		// Warm capacity (warm.go) runs beside delivery, under the same
		// supervisor and context.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			sup.Run(ctx, "fn-warm-capacity", s.warmLoop)
		}()
		sup.Run(ctx, "async-calls", s.asyncLoop)
		wg.Wait()
	}()
	return done
}

// asyncLoop delivers due durable calls until ctx ends, then hands back the
// claims it holds.
func (s *Service) asyncLoop(ctx context.Context) {
	slots := make(chan struct{}, asyncParallel)
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(asyncPoll)
	defer t.Stop()
	for {
		if free := cap(slots) - len(slots); free > 0 {
			claimed, err := s.claim(ctx, free)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("claim durable calls", "err", err)
			}
			for _, c := range claimed {
				slots <- struct{}{}
				wg.Add(1)
				go func() {
					defer func() { <-slots; wg.Done() }()
					s.deliver(ctx, c)
				}()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.wakeAsync:
		}
	}
}

// claim takes up to n due calls for this dispatcher.
func (s *Service) claim(ctx context.Context, n int) ([]store.Call, error) {
	var claimed []store.Call
	var gaveUp []string
	err := s.store.Update(ctx, func(tx store.Tx) error {
		claimed, gaveUp = claimed[:0], gaveUp[:0]
		now := s.now()
		due, err := tx.DueCalls(now, n)
		if err != nil {
			return err
		}
		for _, c := range due {
			timeout := time.Duration(api.FnDefaultTimeout) * time.Second
			f, err := tx.GetFn(c.FnID)
			switch {
			case errors.Is(err, failure.ErrNotFound):
				finish(&c, now, "invalid", "the function was deleted before the call was delivered")
				gaveUp = append(gaveUp, c.FnID)
				if err := tx.PutCall(c); err != nil {
					return err
				}
				continue
			case err != nil:
				return err
			case f.Timeout > 0:
				timeout = time.Duration(f.Timeout) * time.Second
			}
			if c.Attempts >= asyncMaxAttempts {
				finish(&c, now, c.ErrorKind, fmt.Sprintf("gave up after %d deliveries; the last: %s", c.Attempts, c.Error))
				gaveUp = append(gaveUp, c.FnID)
				if err := tx.PutCall(c); err != nil {
					return err
				}
				continue
			}
			c.Status, c.Claim = api.CallRunning, httpapi.NewID("claim-")
			c.Attempts++
			if c.StartedAt == nil {
				c.StartedAt = &now
			}
			c.Due = now.Add(timeout + AnswerGrace + asyncLeaseGrace)
			if err := tx.PutCall(c); err != nil {
				return err
			}
			claimed = append(claimed, c)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, fnID := range gaveUp {
		s.metrics.durable.WithLabelValues(fnID, "failed").Inc()
	}
	return claimed, nil
}

// finish ends a call in error.
func finish(c *store.Call, now time.Time, kind, message string) {
	c.Status, c.ErrorKind, c.Error = api.CallError, kind, message
	if c.ErrorKind == "" {
		c.ErrorKind = callkind.Unavailable
	}
	c.CompletedAt, c.Due, c.Claim = &now, time.Time{}, ""
}

// retryableDurable are the ways a delivery can end that say nothing about
// the function: it is delivered again.
var retryableDurable = map[string]bool{callkind.Busy: true, callkind.NoCapacity: true, callkind.Unreachable: true, callkind.Refused: true,
	callkind.Unavailable: true, callkind.NodeLost: true, callkind.Canceled: true, "capacity_timeout": true}

// bufferSink keeps a durable call's response, up to limit bytes.
type bufferSink struct {
	header   http.Header
	status   int
	body     []byte
	limit    int
	overflow bool
}

var errTooBig = errors.New("the response exceeds what a durable call keeps")

func (b *bufferSink) Header() http.Header    { return b.header }
func (b *bufferSink) WriteHeader(status int) { b.status = status }
func (b *bufferSink) Flush() error           { return nil }
func (b *bufferSink) Write(p []byte) (int, error) {
	if len(b.body)+len(p) > b.limit {
		b.overflow = true
		return 0, errTooBig
	}
	b.body = append(b.body, p...)
	return len(p), nil
}

// deliver runs one claimed call and records its outcome.
func (s *Service) deliver(ctx context.Context, c store.Call) {
	start := s.now()
	e, err := s.lookupFn(ctx, c.FnID)
	if err != nil {
		if ctx.Err() != nil {
			s.release(c)
			return
		}
		s.record(c, callOutcome{kind: callkind.Unavailable, message: err.Error(), retryable: true}, nil)
		return
	}
	body := c.Body
	if body == nil {
		body = []byte{}
	}
	sink := &bufferSink{header: http.Header{}, limit: api.FnMaxResponseBytes}
	call := &fnCall{entry: e, id: c.ID, header: c.Header, data: body, length: int64(len(body)),
		deadline: start.Add(e.spec.Timeout), logs: true, sink: sink}
	dctx, cancel := context.WithDeadline(ctx, call.deadline.Add(AnswerGrace))
	out := s.dispatch(dctx, call)
	cancel()
	s.metrics.observe(e.fn.ID, out.kind, s.now().Sub(start))
	if ctx.Err() != nil {
		// This replica is stopping: hand the call back rather than record
		// an outcome that is ours, not the function's.
		s.release(c)
		return
	}
	if sink.overflow {
		out.kind, out.message = "response_too_big", fmt.Sprintf("the response exceeded the %d bytes a durable call keeps", api.FnMaxResponseBytes)
	}
	s.record(c, out, sink)
}

// record stores a delivery's outcome, if this dispatcher still holds the
// call's claim.
func (s *Service) record(c store.Call, out callOutcome, sink *bufferSink) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	event := ""
	err := s.store.Update(ctx, func(tx store.Tx) error {
		cur, err := tx.GetCall(c.ID)
		if err != nil {
			return err
		}
		if cur.Claim != c.Claim || cur.Status != api.CallRunning {
			event = "stale"
			return nil
		}
		now := s.now()
		cur.NodeID = out.nodeID
		switch {
		case out.kind == "":
			cur.Status, cur.Error, cur.ErrorKind = api.CallSuccess, "", ""
			cur.ResponseStatus, cur.ResponseHeader, cur.ResponseBody = sink.status, sink.header, sink.body
			cur.Log, cur.CompletedAt, cur.Due, cur.Claim = out.log, &now, time.Time{}, ""
			event = "succeeded"
		case retryableDurable[out.kind] && cur.Attempts < asyncMaxAttempts:
			cur.Status, cur.Error, cur.ErrorKind, cur.Claim = api.CallQueued, out.message, out.kind, ""
			cur.Due = now.Add(min(30*time.Second, 500*time.Millisecond<<min(cur.Attempts, 6)))
			event = "retried"
		default:
			finish(&cur, now, out.kind, out.message)
			cur.Log = out.log
			if out.started && sink != nil {
				cur.ResponseStatus, cur.ResponseHeader, cur.ResponseBody = sink.status, sink.header, sink.body
			}
			event = "failed"
		}
		return tx.PutCall(cur)
	})
	if err != nil {
		s.log.Warn("record a durable call's outcome; its claim will lapse and it will be delivered again", "call", c.ID, "err", err)
		return
	}
	s.metrics.durable.WithLabelValues(c.FnID, event).Inc()
	if event == "retried" {
		s.log.Info("durable call to be delivered again", "call", c.ID, "fn", c.FnID, "attempts", c.Attempts, "kind", out.kind, "err", out.message)
	}
}

// release hands a claimed call back, due now.
func (s *Service) release(c store.Call) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.store.Update(ctx, func(tx store.Tx) error {
		cur, err := tx.GetCall(c.ID)
		if err != nil || cur.Claim != c.Claim || cur.Status != api.CallRunning {
			return err
		}
		cur.Status, cur.Claim, cur.Due = api.CallQueued, "", s.now()
		return tx.PutCall(cur)
	})
}
