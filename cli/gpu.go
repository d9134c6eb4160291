package cli

import (
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/termtext"
)

func init() {
	registerSub("node", nodeSummary, &command.Command{Name: "gpu", Summary: "List, cordon and uncordon a node's GPUs", Subs: map[string]*command.Command{
		"ls":       {Name: "ls", Summary: "List a node's GPUs with their health", Run: nodeGPUList},
		"cordon":   {Name: "cordon", Summary: "Place nothing more on one GPU of a node", Run: nodeGPUCordon},
		"uncordon": {Name: "uncordon", Summary: "Return one GPU of a node to service (after a reset)", Run: nodeGPUUncordon},
	}})
}

func nodeGPUList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NODE_ID", `
List NODE_ID's GPUs with their health: STATE is healthy (placed on), sick
(the node reported it so: quarantined until uncordoned), cordoned (an
operator withheld it) or disputed (another node claims the same UUID);
REASON and DETAIL say why, SINCE when it was first seen, REPORTED the
node's own present word. See docs/gpus.md.`)
	g := fs.ClientFlags(true)
	c, id, err := inv.Connect(fs, g, args, "NODE_ID")
	if err != nil {
		return err
	}
	n, err := c.GetNode(ctx, id)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(n.GPUs)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "UUID\tMODEL\tSTATE\tREASON\tSINCE\tREPORTED\tDETAIL")
	for _, gpu := range n.GPUs {
		since := "-"
		if !gpu.Since.IsZero() {
			since = command.FormatTime(&gpu.Since)
		}
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", gpu.UUID, gpu.Model, gpu.State, command.OrDash(gpu.Reason), since, command.OrDash(gpu.Reported), command.OrDash(gpu.Detail))
	}
	return tw.Flush()
}

func nodeGPUCordon(ctx context.Context, inv *command.Invocation, args []string) error {
	return nodeGPUAction(ctx, inv, args, `
Cordon GPU_UUID on NODE_ID: nothing more is placed on it until it is
uncordoned. What runs on it goes on; the node keeps serving with its other
GPUs.`, "cordoned: nothing more is placed on it", (*client.Client).CordonGPU)
}

func nodeGPUUncordon(ctx context.Context, inv *command.Invocation, args []string) error {
	return nodeGPUAction(ctx, inv, args, `
Return GPU_UUID on NODE_ID to service, typically after the card was reset
or the machine rebooted: its cordon and its quarantine are lifted. A
sickness the node saw before now is not raised again; one it sees later
quarantines the card again.`, "uncordoned: it may be placed on again", (*client.Client).UncordonGPU)
}

// nodeGPUAction is the shape of gpu cordon and uncordon: NODE_ID GPU_UUID,
// one call, the GPU's new state printed.
func nodeGPUAction(ctx context.Context, inv *command.Invocation, args []string, help, done string, call func(*client.Client, context.Context, string, string) (api.Node, error)) error {
	fs := inv.Flags("[flags] NODE_ID GPU_UUID", help)
	g := fs.ClientFlags(true)
	var id, uuid string
	c, err := inv.ConnectWith(fs, g, args, func(pos []string) error {
		if len(pos) != 2 {
			return command.Usagef("want NODE_ID GPU_UUID, got %d arguments", len(pos))
		}
		id, uuid = pos[0], pos[1]
		return nil
	})
	if err != nil {
		return err
	}
	n, err := call(c, ctx, id, uuid)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(n)
	}
	_, err = termtext.Fprintf(inv.Stdout, "node %s: GPU %s %s (%s)\n", n.ID, uuid, done, gpuCount(n.GPUs))
	return err
}

// gpuCount is a node's GPUs in a list: "8/8" usable of listed, "-" for a
// node without GPUs, and "0/8 ALL WITHHELD" when none may be placed on.
func gpuCount(gpus []api.NodeGPU) string {
	if len(gpus) == 0 {
		return "0"
	}
	usable := 0
	for _, g := range gpus {
		if g.State == api.GPUStateHealthy {
			usable++
		}
	}
	if usable == 0 {
		return fmt.Sprintf("0/%d ALL WITHHELD", len(gpus))
	}
	return fmt.Sprintf("%d/%d", usable, len(gpus))
}

// gpuHealthText is one GPU of `node get`: its state and, when it is not
// healthy, why and since when.
func gpuHealthText(g api.NodeGPU) string {
	if g.State == api.GPUStateHealthy {
		return g.UUID + " healthy"
	}
	return fmt.Sprintf("%s %s: %s (since %s): %s", g.UUID, g.State, g.Reason, command.FormatTime(&g.Since), g.Detail)
}

// printGPUUsage prints, for each attempt that reported GPU usage, a line per
// GPU: utilization, memory and power as average/peak, the longest idle
// stretch, and IDLE when that reached api.GPUIdleFlagAfter.
func printGPUUsage(inv *command.Invocation, attempts []api.Attempt) error {
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	header := false
	for _, a := range attempts {
		for _, u := range a.GPUUsage {
			if !header {
				fmt.Fprintln(tw, "\nATTEMPT\tGPU\tUTIL AVG/PEAK\tMEMORY AVG/PEAK\tPOWER AVG/PEAK\tLONGEST IDLE\tSAMPLES")
				header = true
			}
			idle := command.FormatDuration(time.Duration(u.LongestIdleSec) * time.Second)
			if u.Idle {
				idle += " IDLE"
			}
			termtext.Fprintf(tw, "%d\t%s\t%s%%/%s%%\t%s/%s MiB\t%s/%s W\t%s\t%d\n", a.Number, u.UUID,
				figure(u.UtilAvg), figure(u.UtilPeak), figure(u.MemoryAvgMiB), figure(u.MemoryPeakMiB),
				figure(u.PowerAvgW), figure(u.PowerPeakW), idle, u.Samples)
		}
	}
	return tw.Flush()
}

// figure is a sampled figure, "-" when the tool did not state it (-1).
func figure(v float64) string {
	if v < 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}
