package controlplane

import (
	"context"
	"strings"
)

// Signals wake waiters: a node's session stream (new operations for it),
// long polls on runs, log followers, and the reconcile loop. With one
// replica they are in-process broadcasts. With several replicas sharing one
// database, a change committed on replica A must wake the session stream
// held by replica B, so every signal is also published through the
// Coordinator, and signals published by other replicas are delivered
// locally. Signals carry no data: a woken waiter re-reads the store, which
// is the only source of truth, so a lost or duplicated signal costs latency
// at worst (every waiter also polls on a timer).

// Coordinator is what several control-plane replicas share besides the
// store. Implementations: none (a single process) and package replica
// (PostgreSQL LISTEN/NOTIFY and an advisory lock).
type Coordinator interface {
	// Publish sends a signal to every other replica. It is best-effort.
	Publish(ctx context.Context, topic string) error
	// Subscribe delivers signals published by other replicas until ctx ends.
	Subscribe(ctx context.Context) <-chan string
	// Leader reports whether this replica currently holds the scheduler's
	// leadership. Exactly one replica places runs at a time, so two
	// snapshots of the same capacity never both commit placements onto it.
	Leader() bool
}

// Signal topics.
const (
	topicRuns      = "runs"
	topicLogs      = "logs"
	topicReconcile = "reconcile"
	topicNode      = "node:"
)

func (s *Server) publish(topic string) {
	if s.coord == nil {
		return
	}
	if err := s.coord.Publish(context.Background(), topic); err != nil {
		s.log.Warn("publish signal to other replicas", "topic", topic, "err", err)
	}
}

// deliver applies a signal locally.
func (s *Server) deliver(topic string) {
	switch {
	case topic == topicRuns:
		s.runs.Notify()
	case topic == topicLogs:
		s.logs.Notify()
	case topic == topicReconcile:
		select {
		case s.reconcileWake <- struct{}{}:
		default:
		}
	case strings.HasPrefix(topic, topicNode):
		s.nodeBroadcast(strings.TrimPrefix(topic, topicNode)).Notify()
	}
}

func (s *Server) signal(topic string) {
	s.deliver(topic)
	s.publish(topic)
}

// nodeChanged wakes the node's session stream, wherever it is held.
func (s *Server) nodeChanged(nodeID string) { s.signal(topicNode + nodeID) }

// runsChanged wakes long polls on runs.
func (s *Server) runsChanged() { s.signal(topicRuns) }

// logsChanged wakes log followers.
func (s *Server) logsChanged() { s.signal(topicLogs) }

// wakeReconcile asks the scheduler leader to reconcile soon.
func (s *Server) wakeReconcile() { s.signal(topicReconcile) }

// leader reports whether this replica runs the reconcile loop's decisions.
func (s *Server) leader() bool { return s.coord == nil || s.coord.Leader() }

// receive delivers other replicas' signals until ctx ends.
func (s *Server) receive(ctx context.Context) {
	if s.coord == nil {
		return
	}
	for topic := range s.coord.Subscribe(ctx) {
		s.deliver(topic)
	}
}
