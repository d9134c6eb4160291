package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/internal/livesession"
	"github.com/mercator/mercator/controlplane/internal/nodereport"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// The session stream: how commands reach a node. Operations come from
// the store (and, when committed on this replica, the mailbox); ephemeral
// commands from the live session (package livesession).

// sessionPoll is how many keep-alives a session stream sends between reads
// of the store when nothing wakes it, with several replicas (5 minutes at
// the default keep-alive). It is the last cover for a lost wake: a
// dropped signal is said afterwards (signals.Lost, which wakes every
// stream), so the timer need not be short, and every idle stream reading
// the store on it was the largest read load of a fleet on PostgreSQL (at 3,
// 30 s: 333 reads a second for 10,000 nodes, 1,666 for 50,000).
const sessionPoll = 30

// keepAliveLine is a keep-alive as the stream carries it, encoded once.
var keepAliveLine = func() []byte {
	b, err := json.Marshal(nodeproto.Command{Kind: nodeproto.KindKeepAlive})
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
	live := s.streams.Attach(c.NodeID, c.Session.FencingToken, r) // package livesession: calls go straight down
	defer s.streams.Detach(live)
	s.fn.NodesChanged() // read the fleet again: a node is back
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	s.log.Info("session opened", "node", c.NodeID, "fencing_token", c.Session.FencingToken)
	defer s.log.Info("session closed", "node", c.NodeID)
	s.metrics.Sessions.Inc()
	defer s.metrics.Sessions.Dec()
	st := &sessionStream{node: c.NodeID, w: w, flusher: flusher, enc: json.NewEncoder(w), sent: map[string]bool{}, live: live}
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
				if err := s.update(ctx, func(tx store.Tx) error { return s.reports().SweepStrays(tx, c.NodeID) }); err != nil {
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
	node    string
	w       http.ResponseWriter
	flusher http.Flusher
	enc     *json.Encoder
	sent    map[string]bool // operation IDs
	mb      *inbox
	live    *livesession.Session
	keep    *time.Ticker
}

// sendOnce writes operation id's command as it is sent (outbound: reads
// minted, credentials attached) unless this stream already sent it; false
// when the stream broke.
func (s *Server) sendOnce(ctx context.Context, st *sessionStream, id string, cmd nodeproto.Command) bool {
	if st.sent[id] {
		return true
	}
	if err := st.enc.Encode(s.outbound(ctx, st.node, cmd)); err != nil {
		return false
	}
	st.sent[id] = true
	return true
}

// sessionRead reads the node's pending operations and, on the first read
// (sweep), whether it runs strays; ok is false when the stream must end
// (the store failed, or the session is fenced). Streams reading at the
// same time read together (sessionReads).
func (s *Server) sessionRead(ctx context.Context, c httpapi.NodeCaller, sweep bool) (ops []store.Operation, strays, ok bool) {
	a, err := s.sessionReads.Read(ctx, sessionReq{node: c.NodeID, token: c.Session.FencingToken, sweep: sweep})
	return a.ops, a.strays, err == nil && !a.fenced
}

// sessionReq is one stream's read: its node, the fencing token its
// session holds, and whether to look for strays.
type sessionReq struct {
	node  string
	token uint64
	sweep bool
}

// sessionAnswer is what a read found for one stream.
type sessionAnswer struct {
	ops    []store.Operation
	strays bool
	fenced bool // the node's token is above the session's
}

// How session streams' reads are batched (package readbatch): at most
// sessionReadSlots read at a time, each for at most sessionReadMax
// streams. A signal from another replica wakes every stream of the nodes
// it names at once; their reads are one transaction and one statement of
// pending operations (store.Tx.PendingOperationsOf) rather than one each.
const (
	sessionReadSlots = 2
	sessionReadMax   = 256
)

// readSessions answers a batch of streams' reads in one transaction: the
// fencing tokens (nodeauth's cache, the misses read together), the
// strays of those sweeping, and the pending operations of every node.
func (s *Server) readSessions(ctx context.Context, reqs []sessionReq) ([]sessionAnswer, error) {
	out := make([]sessionAnswer, len(reqs))
	nodes := make([]string, 0, len(reqs))
	for _, q := range reqs {
		nodes = append(nodes, q.node)
	}
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	err := s.store.View(ctx, func(tx store.Tx) error {
		fences, err := s.fencesOf(tx, nodes)
		if err != nil {
			return err
		}
		pending, err := tx.PendingOperationsOf(nodes)
		if err != nil {
			return err
		}
		for i, q := range reqs {
			fence, stored := fences[q.node]
			// A node no longer stored ends its stream, as a fenced one does.
			out[i] = sessionAnswer{ops: pending[q.node], fenced: !stored || fence > q.token}
			if q.sweep {
				// The first read also looks for strays (nodereport.HasStrays), so a
				// fleet reconnecting costs one read per session.
				if out[i].strays, err = nodereport.HasStrays(tx, q.node); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return out, err
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
			// every sessionPoll keep-alives too covers a wake that was
			// lost without a word (signals.Lost covers those that were
			// dropped). A replica alone hears every signal from itself,
			// and does not read.
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
		case <-st.live.Ready():
			// An invoke is not an operation: no store read follows it.
			if st.live.Forward(st.w, st.enc, st.flusher) != nil {
				return false
			}
		}
	}
}
