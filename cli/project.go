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
	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/internal/termtext"
)

// This file holds `mercator project …`: a team's guaranteed quota, cap,
// weight and pools (docs/teams.md).

const projectSummary = "Share the fleet between teams: projects, quotas and weights"

func init() {
	registerSub("project", projectSummary, &command{name: "create", summary: "Create a project with its quota, cap, weight and pools", run: projectCreate})
	registerSub("project", projectSummary, &command{name: "update", summary: "Change a project's quota, cap, weight or pools (flags not given are kept)", run: projectUpdate})
	registerSub("project", projectSummary, &command{name: "ls", summary: "List projects", run: projectList})
	registerSub("project", projectSummary, &command{name: "get", summary: "Show one project", run: projectGet})
	registerSub("project", projectSummary, &command{name: "rm", summary: "Remove a project without unfinished runs", run: projectRemove})
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

func (pf *projectFlags) define(fs *flagSet) {
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
			return nil, usagef("--gpus %q: write MODEL=N pairs separated by commas, such as H100=16,A100=8", part)
		}
		out[strings.TrimSpace(model)] = count
	}
	return out, nil
}

// parseProject parses a project command's flags and its NAME.
func (inv *invocation) parseProject(fs *flagSet, args []string) (*projectFlags, string, error) {
	var pf projectFlags
	pf.define(fs)
	pos, err := fs.parse(args)
	if err != nil {
		return nil, "", err
	}
	name, err := oneArg(pos, "NAME")
	if err != nil {
		return nil, "", err
	}
	pf.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { pf.set[f.Name] = true })
	return &pf, name, nil
}

func projectCreate(ctx context.Context, inv *invocation, args []string) error {
	fs := inv.flags("NAME [--gpus MODEL=N,...] [--cpu N] [--memory SIZE] [--max-running N] [--weight W] [--pools P1,P2]", "Create a project."+projectHelp)
	g := fs.clientFlags(true)
	pf, name, err := inv.parseProject(fs, args)
	if err != nil {
		return err
	}
	if err := g.check(); err != nil {
		return err
	}
	p := api.Project{Name: name}
	if err := pf.apply(&p); err != nil {
		return err
	}
	c, err := inv.client(g)
	if err != nil {
		return err
	}
	if p, err = c.CreateProject(ctx, p); err != nil {
		return err
	}
	return inv.printProject(g.json(), p, "created")
}

func projectUpdate(ctx context.Context, inv *invocation, args []string) error {
	fs := inv.flags("NAME [--gpus MODEL=N,...] [--cpu N] [--memory SIZE] [--max-running N] [--weight W] [--pools P1,P2]",
		"Change a project: the flags given replace those values, the rest are kept. --gpus replaces the whole GPU quota (--gpus '' removes it)."+projectHelp)
	g := fs.clientFlags(true)
	pf, name, err := inv.parseProject(fs, args)
	if err != nil {
		return err
	}
	if err := g.check(); err != nil {
		return err
	}
	c, err := inv.client(g)
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
	return inv.printProject(g.json(), p, "updated")
}

func (inv *invocation) printProject(asJSON bool, p api.Project, did string) error {
	if asJSON {
		return inv.writeJSON(p)
	}
	termtext.Fprintf(inv.stderr, "%s project %s: %s\n", did, p.Name, describeProject(p))
	return nil
}

// describeProject is a project's quota and limits on one line.
func describeProject(p api.Project) string {
	return fmt.Sprintf("quota %s, max running %s, weight %g, pools %s", formatQuota(p.Quota), orDash(formatCount(p.MaxRunning)),
		p.EffectiveWeight(), orDash(strings.Join(p.Pools, ",")))
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

func projectList(ctx context.Context, inv *invocation, args []string) error {
	fs := inv.flags("[flags]", "List the projects by name; the default project is always there.")
	g := fs.clientFlags(true)
	c, _, err := inv.connect(fs, g, args, "")
	if err != nil {
		return err
	}
	list, err := c.ListProjects(ctx)
	if err != nil {
		return err
	}
	if g.json() {
		return inv.writeJSON(list)
	}
	tw := tabwriter.NewWriter(inv.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tQUOTA\tMAX RUNNING\tWEIGHT\tPOOLS")
	for _, p := range list.Projects {
		termtext.Fprintf(tw, "%s\t%s\t%s\t%g\t%s\n", p.Name, formatQuota(p.Quota), orDash(formatCount(p.MaxRunning)), p.EffectiveWeight(), orDash(strings.Join(p.Pools, ",")))
	}
	return tw.Flush()
}

func projectGet(ctx context.Context, inv *invocation, args []string) error {
	fs := inv.flags("[flags] NAME", "Show one project.")
	g := fs.clientFlags(true)
	c, name, err := inv.connect(fs, g, args, "NAME")
	if err != nil {
		return err
	}
	p, err := c.GetProject(ctx, name)
	if err != nil {
		return err
	}
	if g.json() {
		return inv.writeJSON(p)
	}
	termtext.Fprintf(inv.stdout, "%s: %s\n", p.Name, describeProject(p))
	return nil
}

func projectRemove(ctx context.Context, inv *invocation, args []string) error {
	fs := inv.flags("[flags] NAME", "Remove a project. Its unfinished runs must be cancelled or finished first; the default project cannot be removed.")
	g := fs.clientFlags(false)
	c, name, err := inv.connect(fs, g, args, "NAME")
	if err != nil {
		return err
	}
	if _, err := c.RemoveProject(ctx, name); err != nil {
		return err
	}
	termtext.Fprintf(inv.stderr, "removed project %s\n", name)
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
		s += "; earliest start " + formatTime(q.EarliestStart)
	}
	return s
}

// printQueue prints `run ls --queue`: the queued runs in scheduling order.
func (inv *invocation) printQueue(list api.RunList) error {
	tw := tabwriter.NewWriter(inv.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECT\tPOS\tPRIORITY\tID\tIMAGE\tREASON")
	for _, r := range list.Runs {
		pos := "-"
		if r.Queue != nil {
			pos = fmt.Sprintf("%d/%d", r.Queue.Position, r.Queue.Of)
		}
		termtext.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", api.ProjectOf(r.Project), pos, r.Priority, r.ID, orDash(r.Image), orDash(r.Reason))
	}
	return tw.Flush()
}
