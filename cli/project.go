package cli

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/internal/termtext"
)

// This file holds `mercator project …`: a team's guaranteed quota, cap,
// weight and pools (docs/teams.md).

const projectSummary = "Share the fleet between teams: projects, quotas and weights"

func init() {
	registerSub("project", projectSummary, &command.Command{Name: "create", Summary: "Create a project with its quota, cap, weight and pools", Run: projectCreate})
	registerSub("project", projectSummary, &command.Command{Name: "update", Summary: "Change a project's quota, cap, weight or pools (flags not given are kept)", Run: projectUpdate})
	registerSub("project", projectSummary, &command.Command{Name: "ls", Summary: "List projects", Run: projectList})
	registerSub("project", projectSummary, &command.Command{Name: "get", Summary: "Show one project", Run: projectGet})
	registerSub("project", projectSummary, &command.Command{Name: "rm", Summary: "Remove a project without unfinished runs", Run: projectRemove})
}

const projectHelp = `
A project's quota is what it is guaranteed: --gpus by model (a word the
devices' model names contain, as in H100=16,A100=8), --cpu cores and
--memory (decimal or binary units, such as 2TiB). Work beyond it runs on
capacity other projects leave idle (borrowed), shared by --weight, and is
the first to be reclaimed when its owner needs it. --max-running caps the
project's running runs, borrowed or not; --pools restricts its work to nodes
whose pool label is one of them.`

// projectFlags are the flags that describe a project.
type projectFlags struct {
	gpus, pools *string
	cpu, weight *float64
	memory      bytesize.Value
	maxRunning  *int
	set         map[string]bool
}

func (pf *projectFlags) define(fs *command.FlagSet) {
	pf.gpus = fs.String("gpus", "", "guaranteed GPUs by model, `MODEL=N,...` such as H100=16,A100=8")
	pf.cpu = fs.Float64("cpu", 0, "guaranteed CPU `cores`")
	fs.Var(&pf.memory, "memory", "guaranteed memory `size`, such as 2TiB")
	pf.maxRunning = fs.Int("max-running", 0, "most running runs, borrowed or not (`N`; 0: no cap)")
	pf.weight = fs.Float64("weight", 1, "`share` of borrowed capacity against other projects")
	pf.pools = fs.String("pools", "", "node pools the project's work may use, `P1,P2` (empty: any)")
}

// apply sets on p what the flags given on the command line say.
func (pf *projectFlags) apply(p *api.Project) error {
	if pf.set["gpus"] {
		gpus, err := parseGPUQuota(*pf.gpus)
		if err != nil {
			return err
		}
		p.Quota.GPUs = gpus
	}
	if pf.set["cpu"] {
		p.Quota.CPU = *pf.cpu
	}
	if pf.set["memory"] {
		p.Quota.MemoryBytes = int64(pf.memory)
	}
	if pf.set["max-running"] {
		p.MaxRunning = *pf.maxRunning
	}
	if pf.set["weight"] {
		p.Weight = *pf.weight
	}
	if pf.set["pools"] {
		p.Pools = nil
		for _, pool := range strings.Split(*pf.pools, ",") {
			if pool = strings.TrimSpace(pool); pool != "" {
				p.Pools = append(p.Pools, pool)
			}
		}
	}
	return specUsageError(p.Validate())
}

// parseGPUQuota reads "H100=16,A100=8"; "" is no GPUs.
func parseGPUQuota(s string) (map[string]int, error) {
	out := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		model, n, ok := strings.Cut(part, "=")
		count, err := strconv.Atoi(strings.TrimSpace(n))
		if !ok || err != nil || strings.TrimSpace(model) == "" {
			return nil, command.Usagef("--gpus %q: write MODEL=N pairs separated by commas, such as H100=16,A100=8", part)
		}
		out[strings.TrimSpace(model)] = count
	}
	return out, nil
}

// parseProject parses a project command's flags and its NAME.
func parseProject(inv *command.Invocation, fs *command.FlagSet, args []string) (*projectFlags, string, error) {
	var pf projectFlags
	pf.define(fs)
	pos, err := fs.Parse(args)
	if err != nil {
		return nil, "", err
	}
	name, err := command.OneArg(pos, "NAME")
	if err != nil {
		return nil, "", err
	}
	pf.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { pf.set[f.Name] = true })
	return &pf, name, nil
}

func projectCreate(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("NAME [--gpus MODEL=N,...] [--cpu N] [--memory SIZE] [--max-running N] [--weight W] [--pools P1,P2]", "Create a project."+projectHelp)
	g := fs.ClientFlags(true)
	pf, name, err := parseProject(inv, fs, args)
	if err != nil {
		return err
	}
	if err := g.Check(); err != nil {
		return err
	}
	p := api.Project{Name: name}
	if err := pf.apply(&p); err != nil {
		return err
	}
	c, err := inv.Client(g)
	if err != nil {
		return err
	}
	if p, err = c.CreateProject(ctx, p); err != nil {
		return err
	}
	return printProject(inv, g.JSON(), p, "created")
}

func projectUpdate(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("NAME [--gpus MODEL=N,...] [--cpu N] [--memory SIZE] [--max-running N] [--weight W] [--pools P1,P2]",
		"Change a project: the flags given replace those values, the rest are kept. --gpus replaces the whole GPU quota (--gpus '' removes it)."+projectHelp)
	g := fs.ClientFlags(true)
	pf, name, err := parseProject(inv, fs, args)
	if err != nil {
		return err
	}
	if err := g.Check(); err != nil {
		return err
	}
	c, err := inv.Client(g)
	if err != nil {
		return err
	}
	p, err := c.GetProject(ctx, name)
	if err != nil {
		return err
	}
	if err := pf.apply(&p); err != nil {
		return err
	}
	if p, err = c.UpdateProject(ctx, p); err != nil {
		return err
	}
	return printProject(inv, g.JSON(), p, "updated")
}

func printProject(inv *command.Invocation, asJSON bool, p api.Project, did string) error {
	if asJSON {
		return inv.WriteJSON(p)
	}
	termtext.Fprintf(inv.Stderr, "%s project %s: %s\n", did, p.Name, describeProject(p))
	return nil
}

// describeProject is a project's quota and limits on one line.
func describeProject(p api.Project) string {
	return fmt.Sprintf("quota %s, max running %s, weight %g, pools %s", formatQuota(p.Quota), command.OrDash(formatCount(p.MaxRunning)),
		p.EffectiveWeight(), command.OrDash(strings.Join(p.Pools, ",")))
}

func formatCount(n int) string {
	if n == 0 {
		return ""
	}
	return strconv.Itoa(n)
}

// formatQuota writes a quota as --gpus, --cpu and --memory spell it.
func formatQuota(q api.Quota) string {
	var parts []string
	for _, model := range slices.Sorted(maps.Keys(q.GPUs)) {
		parts = append(parts, fmt.Sprintf("%s=%d", model, q.GPUs[model]))
	}
	if q.CPU > 0 {
		parts = append(parts, fmt.Sprintf("cpu=%g", q.CPU))
	}
	if q.MemoryBytes > 0 {
		parts = append(parts, "memory="+bytesize.Format(q.MemoryBytes))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

func projectList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags]", "List the projects by name; the default project is always there.")
	g := fs.ClientFlags(true)
	c, _, err := inv.Connect(fs, g, args, "")
	if err != nil {
		return err
	}
	list, err := c.ListProjects(ctx)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(list)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tQUOTA\tMAX RUNNING\tWEIGHT\tPOOLS")
	for _, p := range list.Projects {
		termtext.Fprintf(tw, "%s\t%s\t%s\t%g\t%s\n", p.Name, formatQuota(p.Quota), command.OrDash(formatCount(p.MaxRunning)), p.EffectiveWeight(), command.OrDash(strings.Join(p.Pools, ",")))
	}
	return tw.Flush()
}

func projectGet(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NAME", "Show one project.")
	g := fs.ClientFlags(true)
	c, name, err := inv.Connect(fs, g, args, "NAME")
	if err != nil {
		return err
	}
	p, err := c.GetProject(ctx, name)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(p)
	}
	termtext.Fprintf(inv.Stdout, "%s: %s\n", p.Name, describeProject(p))
	if len(p.FunctionReservations) == 0 {
		return nil
	}
	fmt.Fprintln(inv.Stdout, "\nFunction reservations (what its function containers hold, by node):")
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tCONTAINERS\tCPU\tMEMORY")
	for _, r := range p.FunctionReservations {
		termtext.Fprintf(tw, "%s\t%d\t%g\t%s\n", r.Node, r.Containers, r.CPU, bytesize.Format(r.MemoryBytes))
	}
	return tw.Flush()
}

func projectRemove(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NAME", "Remove a project. Its unfinished runs must be cancelled or finished first; the default project cannot be removed.")
	g := fs.ClientFlags(false)
	c, name, err := inv.Connect(fs, g, args, "NAME")
	if err != nil {
		return err
	}
	if _, err := c.RemoveProject(ctx, name); err != nil {
		return err
	}
	termtext.Fprintf(inv.Stderr, "removed project %s\n", name)
	return nil
}

// describeQueue is a queued run's position on one line: "2 of 5 in vision;
// ahead: r-a, r-b; earliest start 2026-…".
func describeQueue(q api.QueuePosition) string {
	s := fmt.Sprintf("%d of %d in %s", q.Position, q.Of, q.Project)
	if len(q.Ahead) > 0 {
		s += "; ahead: " + strings.Join(q.Ahead, ", ")
	}
	if q.EarliestStart != nil {
		s += "; earliest start " + command.FormatTime(q.EarliestStart)
	}
	return s
}

// printQueue prints `run ls --queue`: the queued runs in scheduling order.
func printQueue(inv *command.Invocation, list api.RunList) error {
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECT\tPOS\tPRIORITY\tID\tIMAGE\tREASON")
	for _, r := range list.Runs {
		pos := "-"
		if r.Queue != nil {
			pos = fmt.Sprintf("%d/%d", r.Queue.Position, r.Queue.Of)
		}
		termtext.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", api.ProjectOf(r.Project), pos, r.Priority, r.ID, command.OrDash(r.Image), command.OrDash(r.Reason))
	}
	return tw.Flush()
}

// projectFlag is the --project flag of the commands about objects that
// belong to a project (Artifacts, registry credentials): what says which
// project they are in, or which to list.
func projectFlag(fs *command.FlagSet, what string) *string {
	return fs.String("project", "", "`project` "+what+" (default: $MERCATOR_PROJECT or the context's; else the token's, or default)")
}

// projectOr is flag, or the client's project (the context's or
// $MERCATOR_PROJECT) when flag is empty; "" lets the server choose (the
// token's first project, else default).
func projectOr(c *client.Client, flag string) string {
	if flag != "" {
		return flag
	}
	return c.Project
}
