package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/termtext"
)

// waitForRun waits for the run to end (run wait, run submit --wait),
// showing on stderr, when it is a terminal, each stage the run reaches;
// then a summary line, the run as JSON on stdout with asJSON, and the
// run's exit status (waitExitCode).
func (inv *invocation) waitForRun(ctx context.Context, c *client.Client, id string, asJSON bool) error {
	var observe func(api.Run)
	if inv.stderrIsTerminal() {
		observe = (&runProgress{w: inv.stderr}).observe
	}
	run, err := c.WaitRunFunc(ctx, id, observe)
	if err != nil {
		if ctx.Err() != nil {
			termtext.Fprintf(inv.stderr, "stopped waiting; run %s goes on (mercator run cancel %s stops it)\n", id, id)
			return exitCode(exitCancelled)
		}
		return err
	}
	if asJSON {
		if err := inv.writeJSON(normalizeRun(run)); err != nil {
			return err
		}
	}
	termtext.Fprintln(inv.stderr, runSummaryLine(run))
	if code := waitExitCode(run); code != 0 {
		return exitCode(code)
	}
	return nil
}

// runProgress prints a line each time a waited-on run reaches a new stage
// or a new reason to wait: what a person at a terminal watches. Terminal
// states print nothing (the summary line follows).
type runProgress struct {
	w    io.Writer
	last string
}

func (p *runProgress) observe(r api.Run) {
	line := progressLine(r)
	if line == "" || line == p.last {
		return
	}
	p.last = line
	termtext.Fprintln(p.w, line)
}

// progressLine is the run's stage in words: queued and why; placed,
// preparing (the node pulls the image and copies the Artifacts, with the
// bytes and percent it reports) or running, on its node; "" when the run
// has ended.
func progressLine(r api.Run) string {
	var cur api.Attempt
	if n := len(r.Attempts); n > 0 {
		cur = r.Attempts[n-1]
	}
	node := cur.NodeID
	switch r.Status {
	case api.RunQueued:
		if r.Reason != "" {
			return fmt.Sprintf("run %s queued: %s", r.ID, r.Reason)
		}
		return fmt.Sprintf("run %s queued", r.ID)
	case api.RunPlaced:
		return fmt.Sprintf("run %s placed on node %s", r.ID, node)
	case api.RunPreparing:
		what := "pulling the image"
		if len(r.Artifacts) > 0 {
			what += fmt.Sprintf(", copying %d Artifact(s)", len(r.Artifacts))
		}
		if p := cur.Progress; p != nil {
			what = p.String() // as the node last reported it
		}
		return fmt.Sprintf("run %s preparing on node %s: %s", r.ID, node, what)
	case api.RunRunning:
		return fmt.Sprintf("run %s running on node %s", r.ID, node)
	}
	return ""
}
