package controlplane

import (
	"context"
	"strings"

	"github.com/mercator/mercator/controlplane/internal/broadcast"
	"github.com/mercator/mercator/controlplane/internal/signals"
)

// Signals wake waiters: a node's session stream (new operations for it),
// long polls on runs, log followers, and the reconcile loop. With one
// replica they are in-process broadcasts. With several replicas sharing one
// database, a change committed on replica A must wake the session stream
// held by replica B, so every signal is also published through the
// Coordinator, and signals published by other replicas are delivered
// locally. Signals carry no data: a woken waiter re-reads the store, which
// is the only source of truth, so a lost or duplicated signal costs latency
// at worst (every waiter also polls on a timer), and one dropped on the way
// is said afterwards by signals.Lost, which wakes every waiter.
//
// Signals to other replicas leave in batches: publish queues a topic and
// publishLoop sends everything queued, duplicates dropped, as one
// notification of several lines (signals.BatchPrefix), so that a reconcile pass
// that places work on ten thousand nodes costs a few notifications rather
// than ten thousand round trips made while the caller waits. The queue is
// bounded; a signal that does not fit is dropped, which the paragraph above
// says is safe. One kind of signal names data: "runs:REPLICA:ID,ID,…" says
// which runs a replica wrote, so the leader's copy of active attempts
// (schedcopy.Copy) can read them again; losing one costs a delayed placement
// until the copy's next rebuild, never an over-committed node.

// Coordinator is what several control-plane replicas share besides the
// store. Implementations: none (a single process) and package replica
// (PostgreSQL LISTEN/NOTIFY and an advisory lock).
type Coordinator interface {
	// Publish sends a signal to every other replica. It is best-effort.
	Publish(ctx context.Context, topic string) error
	// Subscribe delivers signals published by other replicas until ctx ends.
	Subscribe(ctx context.Context) <-chan string
	// Leader reports whether this replica believes it holds the
	// scheduler's leadership. A belief can outlive the fact (a lost
	// connection is noticed only so fast), so placements are also fenced
	// by the store: the replica starts a scheduling epoch (store.Lead) as
	// it starts to lead and every placement transaction checks it, so two
	// snapshots of the same capacity never both commit placements onto it.
	Leader() bool
	// Term changes each time this replica takes the leadership, so that
	// it starts a new epoch even when it lost and retook the leadership
	// between two looks at Leader.
	Term() uint64
}

// Signal topics.
const (
	topicRuns      = "runs"
	topicLogs      = "logs"
	topicReconcile = "reconcile"
	topicNode      = "node:"
	topicFence     = "fence:"
	topicRunIDs    = "runs:"
	topicToken     = "token:"
	// topicSessions asks every session stream a replica holds to look at
	// its node's pending operations once (wakeSessions). Replicas before
	// it pass it to the functions service, which ignores it: they fall
	// back on their streams' poll.
	topicSessions = "sessions"
)

// publish queues a signal for the other replicas.
func (s *Server) publish(topic string) {
	if s.coord == nil {
		return
	}
	s.outbox.Queue(topic)
}

// publishIDs queues a signal naming ids, split to fit notifications.
func (s *Server) publishIDs(prefix string, ids []string) {
	s.outbox.QueueIDs(prefix, s.replicaID, ids)
}

// publishLoop sends queued signals in batches (signals.Outbox) until ctx
// ends.
func (s *Server) publishLoop(ctx context.Context) {
	if s.coord == nil {
		return
	}
	s.outbox.Run(ctx, s.send)
}

func (s *Server) send(payload string) {
	if err := s.coord.Publish(context.Background(), payload); err != nil {
		s.log.Warn("publish signals to other replicas", "bytes", len(payload), "err", err)
	}
}

// deliver applies a signal locally.
func (s *Server) deliver(topic string) {
	if strings.HasPrefix(topic, signals.BatchPrefix) {
		for _, t := range signals.Split(topic) {
			s.deliver(t)
		}
		return
	}
	switch {
	case topic == signals.Lost:
		// Some signal was dropped on the way: what it would have said may
		// be anything. The copies of runs are read again whole (a lost
		// "runs:…"), the cached fencing tokens and sessions dropped (a
		// lost "fence:…"), and every waiter looks again.
		s.sched.Invalidate()
		s.queued.Invalidate()
		s.auth.ForgetAll()
		for _, t := range []string{topicRuns, topicLogs, topicReconcile, topicSessions} {
			s.deliver(t)
		}
	case topic == topicSessions:
		s.nodeWake.Range(func(_, b any) bool {
			b.(*broadcast.Broadcast).Notify()
			return true
		})
	case strings.HasPrefix(topic, topicRunIDs):
		if from, ids := signals.RunIDs(topicRunIDs, topic); from != s.replicaID {
			s.sched.MarkDirty(ids)
			s.queued.MarkDirty(ids)
		}
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
	case strings.HasPrefix(topic, topicToken):
		s.tokens.Forget(strings.TrimPrefix(topic, topicToken)) // removed: refuse it at once
	case strings.HasPrefix(topic, topicFence):
		id := strings.TrimPrefix(topic, topicFence)
		s.auth.Forget(id) // its fencing token rose
		s.nodeBroadcast(id).Notify()
	default:
		s.fn.Deliver(topic) // a call, or a log question, for a session held here
	}
}

func (s *Server) signal(topic string) {
	s.deliver(topic)
	s.publish(topic)
}

// nodeChanged wakes the node's session stream, wherever it is held.
func (s *Server) nodeChanged(nodeID string) { s.signal(topicNode + nodeID) }

// fenceChanged says the node was enrolled again, renewed or removed: every
// replica drops the fencing token and the sessions it cached
// (nodes_auth.go) and wakes the node's session streams, so a superseded
// one notices it is fenced.
func (s *Server) fenceChanged(nodeID string) { s.signal(topicFence + nodeID) }

// tokenRemoved makes every replica forget the API credential of that hash.
func (s *Server) tokenRemoved(hash string) { s.signal(topicToken + hash) }

// runsChanged wakes long polls on runs.
func (s *Server) runsChanged() { s.signal(topicRuns) }

// logsChanged wakes log followers.
func (s *Server) logsChanged() { s.signal(topicLogs) }

// wakeSessions makes every session stream of every replica look at its
// node's pending operations once.
func (s *Server) wakeSessions() { s.signal(topicSessions) }

// wakeReconcile asks the scheduler leader to reconcile soon.
func (s *Server) wakeReconcile() { s.signal(topicReconcile) }

// leader reports whether this replica runs the reconcile loop's decisions.
func (s *Server) leader() bool { return s.coord == nil || s.coord.Leader() }

// term is the coordinator's leadership term (0 for a single replica).
func (s *Server) term() uint64 {
	if s.coord == nil {
		return 0
	}
	return s.coord.Term()
}

// receive delivers other replicas' signals until ctx ends.
func (s *Server) receive(ctx context.Context) {
	if s.coord == nil {
		return
	}
	for topic := range s.coord.Subscribe(ctx) {
		s.deliver(topic)
	}
}
