package nodeagent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// Call logs on request: the control plane asks for the log the engine
// keeps of one call (nodeproto.CallLogCommand) when someone reads a
// synchronous call's log, and the agent answers with its own request to
// the asking replica (nodeproto.PathCallLogs). Nothing is stored or
// spooled: an answer lost on the way is the control plane's to give up
// on, and the reader may ask again.

// callLogAnswerTimeout bounds the answer's request. The control plane
// waits less than this for it, so a slower answer is for nobody.
const callLogAnswerTimeout = 30 * time.Second

// answerCallLog serves a call_log command: the call's log when the engine
// keeps it, else an answer that says the node keeps none (an agent
// without functions keeps none; a command fenced below this node's token
// is answered the same way, with that reason, since its asker is a
// superseded enrollment's).
func (a *Agent) answerCallLog(ctx context.Context, cmd nodeproto.Command) {
	q := cmd.CallLog
	if q == nil || q.Request == "" || q.URL == "" {
		a.logger.Warn("call_log command without a request or a URL; ignoring it")
		return
	}
	var text, unknown string
	switch f := a.functions; {
	case cmd.FencingToken < a.state.FencingToken():
		unknown = fmt.Sprintf("command fenced at token %d, below this node's token %d", cmd.FencingToken, a.state.FencingToken())
	case f == nil:
		unknown = "this agent runs no functions"
	default:
		if log, ok := f.engine.Logs(q.CallID); ok {
			text = log.String()
		} else {
			unknown = "this node keeps no log of the call (it did not run it, or has forgotten it)"
		}
	}
	ctx, cancel := context.WithTimeout(ctx, callLogAnswerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(q.URL, "/")+nodeproto.PathCallLogs+q.Request, strings.NewReader(text))
	if err != nil {
		a.logger.Warn("call_log command with a bad URL", "url", q.URL, "err", err)
		return
	}
	nodeID, tok := a.creds()
	req.Header.Set(nodeproto.HeaderNodeID, nodeID)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("User-Agent", "mercator-agent")
	req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	if unknown != "" {
		req.Header.Set(nodeproto.HeaderCallLogUnknown, unknown)
	}
	client := a.controlPlaneClient()
	if a.functions != nil {
		client = a.functions.client
	}
	resp, err := client.Do(req)
	if err != nil {
		a.logger.Debug("answer call_log", "call", q.CallID, "err", err)
		return
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}
