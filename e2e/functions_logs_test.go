package e2e

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
)

// TestSyncCallLogs: a synchronous call that prints lines, made with the
// command line, whose log is then read through the API and the command
// line from the node that ran it; a call no node knows is a 404 that says
// why.
func TestSyncCallLogs(t *testing.T) {
	c := startCluster(t)
	c.startAgent("n")
	_, fn := c.deployHello("synclogs", api.Fn{Image: c.publish("fn-fdk")})
	mark := sha256Hex([]byte(time.Now().String()))[:12]
	lines := []string{"first line " + mark, "second line " + mark}

	out, errOut, code := c.mercatorExit(`{"log":["`+lines[0]+`","`+lines[1]+`"]}`,
		"fn", "invoke", "synclogs", "hello", "--content-type", "application/json", "--call-id")
	callID, ok := strings.CutPrefix(strings.TrimSpace(errOut), "call ")
	if code != 0 || !strings.Contains(out, `"calls"`) || !ok || callID == "" {
		t.Fatalf("fn invoke --call-id: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	holdsLines := func(log string) bool { return strings.Contains(log, lines[0]) && strings.Contains(log, lines[1]) }
	// The container's output reaches the node's engine through the
	// daemon, a moment after the response: wait for it.
	var log string
	c.waitFor("the call's log through the API", func() bool {
		var err error
		log, err = c.client.CallLog(c.ctx, fn.ID, callID)
		return err == nil && holdsLines(log)
	})
	if strings.Index(log, lines[0]) > strings.Index(log, lines[1]) {
		t.Errorf("the log's lines are out of order: %q", log)
	}
	if got := c.mercator("fn", "logs", "synclogs", "hello", callID); !holdsLines(got) {
		t.Errorf("fn logs = %q", got)
	}

	// A call no node keeps.
	_, err := c.client.CallLog(c.ctx, fn.ID, "call-nosuchcall")
	if !errors.Is(err, failure.ErrNotFound) || !strings.Contains(err.Error(), "none of the 1 nodes it could have run on keeps its log") {
		t.Errorf("log of an unknown call: %v", err)
	}
	if _, errOut, code := c.mercatorExit("", "fn", "logs", "synclogs", "hello", "call-nosuchcall"); code == 0 || !strings.Contains(errOut, "Call log not found") {
		t.Errorf("fn logs of an unknown call: exit %d, %q", code, errOut)
	}
}
