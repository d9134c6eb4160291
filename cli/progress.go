package cli

import (
	"context"
	"io"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/termtext"
)

// waitForRun waits for the run to end (run wait, run submit --wait),
// showing on stderr, when it is a terminal, each stage the run reaches;
// then a summary line, the run as JSON on stdout with asJSON, and the
// run's exit status (waitExitCode).
func waitForRun(ctx context.Context, inv *command.Invocation, c *client.Client, id string, asJSON bool) error {
	var observe func(api.Run)
	if inv.StderrIsTerminal() {
		observe = (&runProgress{w: inv.Stderr}).observe
	}
	run, err := c.WaitRunFunc(ctx, id, observe)
	if err != nil {
		if ctx.Err() != nil {
			termtext.Fprintf(inv.Stderr, "stopped waiting; run %s goes on (mercator run cancel %s stops it)\n", id, id)
			return command.ExitCode(exitCancelled)
		}
		return err
	}
	if asJSON {
		if err := inv.WriteJSON(normalizeRun(run)); err != nil {
			return err
		}
	}
	termtext.Fprintln(inv.Stderr, runSummaryLine(run))
	if code := waitExitCode(run); code != 0 {
		return command.ExitCode(code)
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
	stage := r.Stage()
	if stage == "" || stage == p.last {
		return
	}
	p.last = stage
	termtext.Fprintf(p.w, "run %s %s\n", r.ID, stage)
}
