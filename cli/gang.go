package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/internal/termtext"
)

// printMembers prints a gang run's latest attempt set (docs/gpus.md "Gang
// runs"): each member's rank, attempt, node, number of GPUs (their UUIDs
// are in -o json and the usage table) and status, so that `run get` shows
// where every rank is without reading the attempt list.
// It prints nothing for a run that is not a gang or has no set yet.
func printMembers(inv *command.Invocation, r api.Run) error {
	if r.Nodes <= 1 || len(r.Attempts) == 0 {
		return nil
	}
	set := r.Attempts[len(r.Attempts)-1].Set
	termtext.Fprintf(inv.Stdout, "Members (gang of %d, attempt set %d):\n", r.Nodes, set)
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RANK\tATTEMPT\tNODE\tGPUS\tSTATUS")
	for _, a := range r.Attempts {
		if a.Set != set {
			continue
		}
		termtext.Fprintf(tw, "%d\t%d\t%s\t%d\t%s\n", a.Rank, a.Number, command.OrDash(a.NodeID), len(a.GPUs), a.Status)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(inv.Stdout)
	return err
}

// attemptLabel is an attempt's number in the attempt table, with its set
// and rank for a gang's member ("3 (set 2, rank 0)").
func attemptLabel(a api.Attempt) string {
	if a.Set == 0 {
		return fmt.Sprint(a.Number)
	}
	return fmt.Sprintf("%d (set %d, rank %d)", a.Number, a.Set, a.Rank)
}
