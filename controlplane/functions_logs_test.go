package controlplane

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// answerLog answers a call_log command as an agent does: the log the node
// keeps, or that it keeps none.
func (n *fakeNode) answerLog(q nodeproto.CallLogCommand) {
	text, held := n.logs.Load(q.CallID)
	body := ""
	if held {
		body = text.(string)
	}
	req, err := http.NewRequest("POST", q.URL+nodeproto.PathCallLogs+q.Request, strings.NewReader(body))
	if err != nil {
		panic(err) // a bad URL: the test's own mistake, off the test's goroutine
	}
	req.Header.Set(nodeproto.HeaderNodeID, n.id)
	req.Header.Set("Authorization", "Bearer "+n.tok)
	if !held {
		req.Header.Set(nodeproto.HeaderCallLogUnknown, "not here")
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
}

// TestSyncCallLogFromNodes: the log of a call the store does not hold is
// asked of the nodes in the function's order, the first node alone first;
// a cordoned node is asked, an agent too old is not; and when no node
// keeps it the 404 says why.
func TestSyncCallLogFromNodes(t *testing.T) {
	f := newFnFixture(t)
	n1, n2 := f.startNode("n1", echo), f.startNode("n2", echo)
	_, fn := f.deploy("app", api.Fn{Name: "echo"})
	first, second := n1, n2
	// The function's order (scheduler.PlaceFunction) decides who is first.
	if order := scheduler.PlaceFunction(fn.ID, []scheduler.FunctionNode{{ID: "n1"}, {ID: "n2"}}, scheduler.FunctionNeed{}); order[0].ID == "n2" {
		first, second = n2, n1
	}
	logPath := func(id string) string { return "/v2/fns/" + fn.ID + "/calls/" + id + "/log" }
	asked := func() [2]int64 { return [2]int64{first.asked.Load(), second.asked.Load()} }

	// A real call: its ID is the one the node keeps the log under.
	status, h, _ := f.do("POST", "/invoke/"+fn.ID, "x")
	callID := h.Get("Fn-Call-Id")
	if status != 201 || h.Get("X-Node") != first.id {
		t.Fatalf("invoke = %d on %q, want it on %s", status, h.Get("X-Node"), first.id)
	}
	first.logs.Store(callID, "line one\nline two\n")
	status, h, body := f.do("GET", logPath(callID), nil)
	if status != 200 || string(body) != "line one\nline two\n" || !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		t.Fatalf("log = %d %q %v", status, body, h)
	}
	if got := asked(); got != [2]int64{1, 0} {
		t.Errorf("asked (first, second) = %v, want the first node alone", got)
	}
	var js api.CallLogResponse
	f.want(200, &js, "GET", logPath(callID), nil, "Accept", "application/json")
	if js.Log.CallID != callID || js.Log.Log != "line one\nline two\n" {
		t.Errorf("JSON log = %+v", js)
	}

	// A log on the second node: found once the first says it has none.
	second.logs.Store("call-spilled", "spilled\n")
	before := asked()
	if status, _, body := f.do("GET", logPath("call-spilled"), nil); status != 200 || string(body) != "spilled\n" {
		t.Errorf("log on the second node = %d %q", status, body)
	}
	if got := asked(); got != [2]int64{before[0] + 1, before[1] + 1} {
		t.Errorf("asked %v after %v, want each node once", got, before)
	}

	// Nowhere.
	f.wantFnError(404, "Call log not found: the call is not a durable one, and none of the 2 nodes it could have run on keeps its log", "GET", logPath("call-nowhere"), nil)

	// A cordoned node still keeps the logs of what it ran.
	setNode := func(id string, change func(*store.Node)) {
		t.Helper()
		if err := f.st.Update(context.Background(), func(tx store.Tx) error {
			n, err := tx.GetNode(id)
			if err != nil {
				return err
			}
			change(&n)
			return tx.PutNode(n)
		}); err != nil {
			t.Fatal(err)
		}
	}
	setNode(first.id, func(n *store.Node) { n.Cordoned = true })
	if status, _, body := f.do("GET", logPath(callID), nil); status != 200 || string(body) != "line one\nline two\n" {
		t.Errorf("log on a cordoned node = %d %q", status, body)
	}

	// An agent too old for the command is not asked, and the 404 says so.
	setNode(second.id, func(n *store.Node) { n.Facts.CapabilityVersion = nodeproto.VersionCallLogs - 1 })
	before = asked()
	f.wantFnError(404, "1 nodes run an agent older than capability version 4", "GET", logPath("call-spilled"), nil)
	if got := asked(); got[1] != before[1] {
		t.Errorf("the old agent was asked: %v after %v", got, before)
	}
	setNode(second.id, func(n *store.Node) { n.Facts.CapabilityVersion = nodeproto.Version })

	// A node whose session is gone is named. (Once the control plane has
	// seen the stream end: asked before that, the node is named as one
	// whose session ended while it was being asked.)
	second.stop()
	for deadline := time.Now().Add(time.Minute); f.srv.streams.Get(second.id) != nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the control plane still holds the stopped node's session")
		}
	}
	f.wantFnError(404, "no answer from "+second.id+" (not connected)", "GET", logPath("call-spilled"), nil)

	// A durable call of another function is not this function's, and an
	// ID this control plane could not have minted is asked of nobody.
	_, other := f.deploy("app", api.Fn{Name: "other"})
	var detached api.DetachedCall
	f.want(202, &detached, "POST", "/invoke/"+other.ID+"/async", "x")
	before = asked()
	f.wantFnError(404, "Call not found", "GET", logPath(detached.CallID), nil)
	f.wantFnError(404, "Call not found", "GET", logPath("CALL_X"), nil)
	if got := asked(); got != before {
		t.Errorf("nodes were asked for a call that is not a synchronous one of this function: %v after %v", got, before)
	}
}

// TestSyncCallLogWithoutNodes: with no node to ask, the 404 says that.
func TestSyncCallLogWithoutNodes(t *testing.T) {
	f := newFnFixture(t)
	_, fn := f.deploy("app", api.Fn{Name: "echo"})
	status, _, body := f.do("GET", "/v2/fns/"+fn.ID+"/calls/call-x/log", nil)
	var e api.FnError
	if status != 404 || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Message, "no ready node runs functions") {
		t.Errorf("log with no nodes = %d %s", status, body)
	}
}
