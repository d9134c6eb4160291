package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/termtext"
	"github.com/mercator/mercator/nodeproto"
)

// drainCheckEvery is how often `node drain --wait` reads the node: a node
// has no long poll, and one read every few seconds from one terminal is
// nothing next to the agents' own reports.
const drainCheckEvery = 2 * time.Second

// drainLeft is what a draining node still has: its attempts and its
// function containers (any state) as its last facts state them.
func drainLeft(n api.Node) (runs, containers int) {
	if n.Facts != nil {
		raw, _ := json.Marshal(n.Facts)
		var facts nodeproto.NodeFacts
		if json.Unmarshal(raw, &facts) == nil && facts.Functions != nil {
			for _, ct := range facts.Functions.Containers {
				containers += ct.Idle + ct.Busy + ct.Starting + ct.Prepared
			}
		}
	}
	return len(n.Running), containers
}

// drainProgress prints a line each time what is left on a draining node
// changes (the first read included).
type drainProgress struct {
	w    io.Writer
	last string
}

func (p *drainProgress) observe(n api.Node) {
	runs, containers := drainLeft(n)
	line := fmt.Sprintf("node %s draining: %d runs and %d function containers left", n.ID, runs, containers)
	if line != p.last {
		p.last = line
		termtext.Fprintln(p.w, line)
	}
}

// waitDrained reads the node until nothing is left on it, showing on
// stderr, when it is a terminal, what is left at each change; it returns
// the node as it then is. It stops early if the node is no longer
// draining (an uncordon) and says so.
func waitDrained(ctx context.Context, inv *command.Invocation, c *client.Client, n api.Node) (api.Node, error) {
	var p *drainProgress
	if inv.StderrIsTerminal() {
		p = &drainProgress{w: inv.Stderr}
	}
	t := time.NewTicker(drainCheckEvery)
	defer t.Stop()
	for {
		if !n.Draining {
			return n, fmt.Errorf("node %s is no longer draining (uncordoned?); stopped waiting", n.ID)
		}
		if p != nil {
			p.observe(n)
		}
		if runs, containers := drainLeft(n); runs == 0 && containers == 0 {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-t.C:
		}
		var err error
		if n, err = c.GetNode(ctx, n.ID); err != nil {
			return n, err
		}
	}
}
