package cli

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/internal/termtext"
)

// This file holds `mercator node label`: the labels runs' constraints
// (`run submit --constraint`) and projects' pools select on (docs/teams.md).

func init() {
	registerSub("node", nodeSummary, &command.Command{Name: "label", Summary: "Set (KEY=VALUE) or remove (KEY-) a node's labels", Run: nodeLabel})
}

func nodeLabel(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NODE_ID KEY=VALUE... KEY-...", `
Set and remove a node's labels. Runs select nodes by label with
`+"`run submit --constraint KEY=VALUE`"+`, and a project restricted to pools
(`+"`project create --pools`"+`) runs only on nodes whose pool label is one of
them:

    mercator node label gpu-7 pool=secure zone=b
    mercator node label gpu-7 zone-`)
	g := fs.ClientFlags(true)
	var nodeID string
	var req api.NodeLabelsRequest
	c, err := inv.ConnectWith(fs, g, args, func(pos []string) error {
		if len(pos) < 2 {
			return command.Usagef("want a NODE_ID and at least one KEY=VALUE or KEY-")
		}
		nodeID = pos[0]
		for _, arg := range pos[1:] {
			if k, ok := strings.CutSuffix(arg, "-"); ok && !strings.Contains(arg, "=") {
				req.Remove = append(req.Remove, k)
				continue
			}
			k, v, ok := strings.Cut(arg, "=")
			if !ok {
				return command.Usagef("%q: write KEY=VALUE to set a label or KEY- to remove one", arg)
			}
			if req.Set == nil {
				req.Set = map[string]string{}
			}
			req.Set[k] = v
		}
		return specUsageError(api.ValidateLabels("labels", req.Set))
	})
	if err != nil {
		return err
	}
	n, err := c.LabelNode(ctx, nodeID, req)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(n)
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
		parts = append(parts, k+"="+n.Labels[k])
	}
	termtext.Fprintf(inv.Stderr, "node %s labels: %s\n", n.ID, command.OrDash(strings.Join(parts, " ")))
	return nil
}
