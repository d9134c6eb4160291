package function

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// Synchronous calls' logs, from the nodes.
//
// A synchronous call is never stored, so its log stays where the engine
// that ran it keeps it: on the node, for the node's most recent calls
// (fnagent.Config.LogRetention, bounded in bytes per call). When the API
// is asked for the log of a call the store does not hold, the control
// plane asks the nodes the call could have run on, in the order calls of
// the function are offered to them: the function's rendezvous-hash order
// (scheduler.PlaceFunction), over the ready nodes whose share can hold it. The
// first node alone first, since a call nearly always runs on its
// function's first node; then the next few together (a call spills to at
// most maxTries nodes, and nodes that joined since may rank before the one
// that ran it). The first log found is the answer. Nothing is written per
// call: whoever reads a log pays for it, and calls stay as cheap as they
// were.
//
// Cordoned and draining nodes take no calls but are asked: they keep the
// logs of the calls they ran. Nodes whose agent is older than
// nodeproto.VersionCallLogs are not asked (they would take the unknown
// command for an operation), and the answer says so when they were
// skipped.
//
// The question travels as an invoke does (invoke.go): a call_log command
// handed to the node's session when this replica holds it, or published
// through the Coordinator to the replica that does (the command is small,
// so it travels whole). The agent answers with its own request to this
// replica (nodeproto.PathCallLogs), which meets the question here by its
// ID, in Service.logAsks.

const (
	// logAskMost bounds how many nodes one log read asks.
	logAskMost = 2 * maxTries
	// logAskTimeout is how long a node has to answer.
	logAskTimeout = 5 * time.Second
	// maxCallLog bounds an answer's body (an engine keeps 64 KiB per call
	// by default).
	maxCallLog = 4 << 20
)

// logAsk is one question to one node.
type logAsk struct {
	nodeID string
	answer chan logAnswer // buffered: the first answer is kept
}

// logAnswer is a node's answer, or why there is none.
type logAnswer struct {
	nodeID string
	held   bool
	text   string
	// silent says why the node gave no answer ("" when it answered).
	silent string
}

// syncCallLog returns the log of a synchronous call of the function
// fnID, from the first node that keeps it. Errors: Fn's 404 with a
// message saying why no node could give it, or the store's.
func (s *Service) syncCallLog(ctx context.Context, fnID, callID string) (string, error) {
	if !plausibleID(callID) {
		return "", errCallNotFound
	}
	var nodes []store.Node
	var need scheduler.FunctionNeed
	err := s.store.View(ctx, func(tx store.Tx) error {
		// A durable call of another function is not this function's.
		if _, err := tx.GetCall(callID); err == nil {
			return errCallNotFound
		} else if !errors.Is(err, failure.ErrNotFound) {
			return err
		}
		// A deleted function's calls may still have logs: every node
		// that runs functions is then asked, in the same order.
		if f, err := tx.GetFn(fnID); err == nil {
			// What placement uses (cache.go).
			need = newFnEntry(f, store.App{}, nil, time.Time{}).need
		} else if !errors.Is(err, failure.ErrNotFound) {
			return err
		}
		var err error
		nodes, err = tx.ListNodes()
		return err
	})
	if err != nil {
		return "", err
	}
	order, old := logNodes(fnID, nodes, func(n store.Node) bool { return s.host.NodeReady(n) }, need)
	order = order[:min(len(order), logAskMost)]

	var silent []string
	for _, wave := range [][]scheduler.FunctionNode{order[:min(1, len(order))], order[min(1, len(order)):]} {
		a, quiet := s.askAll(ctx, wave, callID)
		if a.held {
			return a.text, nil
		}
		silent = append(silent, quiet...)
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
	}
	return "", errNoCallLog(len(order), old, silent)
}

// errNoCallLog is the 404 when no node gave the log: asked nodes were
// asked, old ones skipped, silent ones did not answer (node: why).
func errNoCallLog(asked, old int, silent []string) error {
	msg := "Call log not found: the call is not a durable one, and "
	if asked == 0 {
		msg += "no ready node runs functions to ask for a synchronous call's log"
	} else {
		msg += fmt.Sprintf("none of the %d nodes it could have run on keeps its log (a node keeps the logs of its most recent calls only; the log aged out, or its node is gone)", asked)
	}
	if len(silent) > 0 {
		msg += "; no answer from " + strings.Join(silent, ", ")
	}
	if old > 0 {
		msg += fmt.Sprintf("; %d nodes run an agent older than capability version %d, which cannot be asked", old, nodeproto.VersionCallLogs)
	}
	return fnError(http.StatusNotFound, "%s", msg)
}

// logNodes are the nodes that may keep a synchronous call's log of the
// function fnID, in the order its calls are offered to nodes (scheduler.PlaceFunction):
// the ready nodes whose function share can hold need, cordoned and
// draining ones included. old counts the ready ones whose agent is too
// old to ask.
func logNodes(fnID string, nodes []store.Node, ready func(store.Node) bool, need scheduler.FunctionNeed) (order []scheduler.FunctionNode, old int) {
	var askable []scheduler.FunctionNode
	for _, n := range nodes {
		isReady := ready(n)
		// A cordoned or draining node takes no calls but keeps the
		// logs of those it ran.
		n.Cordoned, n.Draining = false, false
		fn, ok := fnNodeOf(n, isReady)
		if !ok {
			continue
		}
		if n.Facts.CapabilityVersion < nodeproto.RequiredVersion(nodeproto.Command{Kind: nodeproto.KindCallLog}) {
			old++
			continue
		}
		askable = append(askable, fn)
	}
	return scheduler.PlaceFunction(fnID, askable, need), old
}

// plausibleID reports whether id could be an ID this control plane
// minted (newID), so nothing else is sent to nodes.
func plausibleID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// askAll asks the nodes at once and returns the first answer that holds
// the log (the others are abandoned), or none, with the nodes that did not
// answer and why.
func (s *Service) askAll(ctx context.Context, nodes []scheduler.FunctionNode, callID string) (logAnswer, []string) {
	if len(nodes) == 0 {
		return logAnswer{}, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answers := make(chan logAnswer, len(nodes))
	for _, n := range nodes {
		go func() { answers <- s.ask(ctx, n.ID, callID) }()
	}
	var silent []string
	for range nodes {
		a := <-answers
		if a.held {
			return a, nil
		}
		if a.silent != "" {
			silent = append(silent, a.nodeID+" ("+a.silent+")")
		}
	}
	return logAnswer{}, silent
}

// ask sends one node the question and waits for its answer, at most
// logAskTimeout.
func (s *Service) ask(ctx context.Context, nodeID, callID string) logAnswer {
	q := &logAsk{nodeID: nodeID, answer: make(chan logAnswer, 1)}
	cmd := nodeproto.CallLogCommand{CallID: callID, Request: httpapi.NewID("lq-"), URL: s.replicaURL()}
	s.logAsks.Store(cmd.Request, q)
	defer s.logAsks.Delete(cmd.Request)
	lost, held, sent := s.host.Send(nodeID, nodeproto.Command{Kind: nodeproto.KindCallLog, CallLog: &cmd})
	if held {
		if !sent {
			return logAnswer{nodeID: nodeID, silent: "its session is backed up"}
		}
	} else if s.pub != nil {
		raw, err := json.Marshal(publishedCallLog{NodeID: nodeID, Cmd: cmd})
		if err == nil {
			err = s.pub.Publish(ctx, topicCallLog+string(raw))
		}
		if err != nil {
			return logAnswer{nodeID: nodeID, silent: "publish to its replica: " + err.Error()}
		}
	} else {
		return logAnswer{nodeID: nodeID, silent: "not connected"}
	}
	t := time.NewTimer(logAskTimeout)
	defer t.Stop()
	select {
	case a := <-q.answer:
		return a
	case <-lost:
		return logAnswer{nodeID: nodeID, silent: "its session ended"}
	case <-t.C:
		return logAnswer{nodeID: nodeID, silent: "no answer within " + logAskTimeout.String()}
	case <-ctx.Done():
		return logAnswer{nodeID: nodeID, silent: "abandoned"}
	}
}

// topicCallLog carries a call_log command to the replica holding the
// node's session.
const topicCallLog = "call_log:"

type publishedCallLog struct {
	NodeID string                   `json:"node_id"`
	Cmd    nodeproto.CallLogCommand `json:"cmd"`
}

// deliverCallLog hands a call_log command another replica published to
// the node's session, if this replica holds it.
func (s *Service) deliverCallLog(topic string) {
	if s == nil {
		return
	}
	var p publishedCallLog
	if err := json.Unmarshal([]byte(strings.TrimPrefix(topic, topicCallLog)), &p); err != nil {
		return
	}
	// Backed up or not held: the asker gives up after logAskTimeout.
	s.host.Send(p.NodeID, nodeproto.Command{Kind: nodeproto.KindCallLog, CallLog: &p.Cmd})
}

// callLogAnswer takes a node's answer to a call_log command.
func (s *Service) callLogAnswer(w http.ResponseWriter, r *http.Request, c httpapi.NodeCaller) {
	v, ok := s.logAsks.Load(r.PathValue("id"))
	if !ok {
		writeFnJSON(w, http.StatusGone, api.ErrorOf(failure.NotFound("call log request", r.PathValue("id"))))
		return
	}
	q := v.(*logAsk)
	if q.nodeID != c.NodeID {
		httpapi.WriteError(w, failure.Conflict("call log request %s was not sent to node %s", r.PathValue("id"), c.NodeID))
		return
	}
	text, err := io.ReadAll(io.LimitReader(r.Body, maxCallLog))
	if err != nil {
		httpapi.WriteError(w, failure.Invalid("body", "reading the log: %v", err))
		return
	}
	a := logAnswer{nodeID: c.NodeID, held: true, text: string(text)}
	if why := r.Header.Get(nodeproto.HeaderCallLogUnknown); why != "" {
		a = logAnswer{nodeID: c.NodeID}
	}
	select {
	case q.answer <- a:
	default: // answered already
	}
	w.WriteHeader(http.StatusOK)
}
