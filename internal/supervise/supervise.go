// Package supervise keeps a process's long-lived loops running through
// their own bugs: a panic inside a loop is recovered, logged with its
// stack, reported to a counter, and the loop is started again after a
// backoff, instead of ending the process (a panic in a goroutine that no one
// recovers kills the whole program, every session and request with it).
//
// It is the one such helper in the module: the control plane's loops
// (group commit, reconcile, liveness flush, audit, replica signals, durable
// calls) and the node agent's (session, spool flush, heartbeat, facts,
// renewal, observation) all run under Supervisor.Run. Any package in the
// module may import it; it imports nothing of the module's own.
package supervise

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"
)

// Default backoffs: the first restart after DefaultBackoff, doubling on
// each panic in a row up to DefaultMaxBackoff, so a loop that panics at
// once on every start costs a log line a minute rather than a busy spin.
const (
	DefaultBackoff    = time.Second
	DefaultMaxBackoff = time.Minute
)

// Supervisor runs loops. The zero value logs to slog.Default, counts
// nothing and uses the default backoffs. Safe for concurrent use.
type Supervisor struct {
	Log *slog.Logger
	// Panicked, when set, is called with the loop's name once per
	// recovered panic (the caller's metric).
	Panicked func(loop string)
	// Backoff is the wait before the first restart, MaxBackoff the longest
	// (defaults DefaultBackoff and DefaultMaxBackoff). A loop that ran
	// longer than MaxBackoff before it panicked starts again from Backoff.
	Backoff, MaxBackoff time.Duration
}

// Run calls loop(ctx) and returns when it returns normally. When loop
// panics, Run recovers, logs the panic with its stack, calls Panicked, waits
// the backoff (or until ctx ends, then returns) and calls loop again.
// http.ErrAbortHandler is not special here: a loop is not a handler.
func (s Supervisor) Run(ctx context.Context, name string, loop func(ctx context.Context)) {
	backoff, maxBackoff := s.Backoff, s.MaxBackoff
	if backoff <= 0 {
		backoff = DefaultBackoff
	}
	if maxBackoff < backoff {
		maxBackoff = max(DefaultMaxBackoff, backoff)
	}
	wait := backoff
	for {
		start := time.Now()
		v, stack, panicked := s.once(ctx, loop)
		if !panicked {
			return
		}
		if time.Since(start) > maxBackoff {
			wait = backoff
		}
		log := s.Log
		if log == nil {
			log = slog.Default()
		}
		log.Error("loop panicked; restarting it", "loop", name, "panic", fmt.Sprint(v), "restart_in", wait, "stack", string(stack))
		if s.Panicked != nil {
			s.Panicked(name)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(wait*2, maxBackoff)
	}
}

// Group is loops started together under one Supervisor (Start), waited
// for together (Wait).
type Group struct {
	sup Supervisor
	ctx context.Context
	wg  sync.WaitGroup
}

// Start returns an empty group whose loops run until ctx ends.
func (s Supervisor) Start(ctx context.Context) *Group { return &Group{sup: s, ctx: ctx} }

// Go runs loop under the group's Supervisor (Run) in a goroutine of its own.
func (g *Group) Go(name string, loop func(ctx context.Context)) {
	g.wg.Add(1)
	go func() { defer g.wg.Done(); g.sup.Run(g.ctx, name, loop) }()
}

// Wait returns once every loop started with Go returned.
func (g *Group) Wait() { g.wg.Wait() }

// once runs loop and reports a panic's value and stack.
func (s Supervisor) once(ctx context.Context, loop func(ctx context.Context)) (v any, stack []byte, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			v, stack, panicked = r, debug.Stack(), true
		}
	}()
	loop(ctx)
	return nil, nil, false
}
