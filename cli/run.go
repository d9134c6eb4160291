package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/internal/secretflag"
	"github.com/mercator/mercator/internal/termtext"
)

const runSummary = "Submit, inspect, wait on and cancel runs"

func init() {
	registerSub("run", runSummary, &command.Command{Name: "submit", Summary: "Submit a run (or --count N copies) and print its ID", Run: runSubmit})
	registerSub("run", runSummary, &command.Command{Name: "get", Summary: "Show a run and its attempts", Run: runGet})
	registerSub("run", runSummary, &command.Command{Name: "ls", Summary: "List runs, newest first", Run: runList})
	registerSub("run", runSummary, &command.Command{Name: "wait", Summary: "Wait for a run to end and exit with its exit code", Run: runWait})
	registerSub("run", runSummary, &command.Command{Name: "logs", Summary: "Print a run's output (-f to follow it)", Run: runLogs})
	registerSub("run", runSummary, &command.Command{Name: "cancel", Summary: "Cancel a run", Run: runCancel})
}

func runSubmit(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("--image REF [flags] [--] [CMD [ARGS...]]", `
Submit a run: one container started from the image with the command, on a
node the control plane picks. The image is pinned to its digest at submit.
Prints the new run's ID, and nothing else, on stdout, so that

    id=$(mercator run submit --image alpine:3 -- echo hello)

captures it. Flags come before the command; everything from "--" (or from
the first argument that is not a flag) on is the command and its arguments.
A command is required; when the image has an ENTRYPOINT, the command is
passed to it as arguments.

--wait prints the ID, then waits as 'mercator run wait' does: on a terminal,
stderr shows the run moving (queued and why, preparing on its node, running),
then a summary; the exit status is the run's (see 'mercator run wait -h').

--count N submits N copies of the run (a sweep), each with
MERCATOR_RUN_INDEX set to its index, 0 to N-1, in its environment, through
the batch API: one call per 1,000 runs, each call all or nothing. It
prints every run's ID, one per line in index order, and nothing else, on
stdout (with -o json, {"runs": [...]}). Should a call fail after others
succeeded, the IDs of the runs created stay on stdout and stderr says how
many were created and which indexes were not. --count 1 is a sweep of one
(with MERCATOR_RUN_INDEX=0); without --count, one run is submitted as is.
`+"`--env MERCATOR_RUN_INDEX=…`"+` cannot be combined with --count.

Sizes for --memory take decimal (KB, MB, GB, TB) or binary (KiB, MiB, GiB,
TiB) units; a plain number is bytes.
`+secretflag.Help)
	g := fs.ClientFlags(true)
	var sf submitFlags
	sf.define(fs)
	wait := fs.Bool("wait", false, "after printing the ID, wait for the run to end as 'mercator run wait' does (its progress on a terminal, its exit status)")
	argv, err := fs.ParseHead(args)
	if err != nil {
		return err
	}
	if err := g.Check(); err != nil {
		return err
	}
	countSet := false
	fs.Visit(func(f *flag.Flag) {
		sf.set[f.Name] = true
		countSet = countSet || f.Name == "count"
	})
	spec, err := sf.spec(argv, inv.Env)
	if err != nil {
		return err
	}
	c, err := inv.Client(g)
	if err != nil {
		return err
	}
	if spec.Project == "" {
		spec.Project = c.Project
	}
	if countSet {
		if *wait {
			return command.Usagef("--wait waits for one run; with --count, wait for each ID with 'mercator run wait'")
		}
		return submitCopies(ctx, inv, c, spec, *sf.count, g.JSON())
	}
	run, err := keyed(ctx, inv, func(key client.SubmitOption) (api.Run, error) { return c.SubmitRun(ctx, spec, key) })
	if err != nil {
		return err
	}
	if *wait {
		// The ID first, so that a script that captures it still can
		// (with -o json, the run as it ended is the output).
		if !g.JSON() {
			if _, err := termtext.Fprintln(inv.Stdout, run.ID); err != nil {
				return err
			}
		}
		return waitForRun(ctx, inv, c, run.ID, g.JSON())
	}
	if g.JSON() {
		return inv.WriteJSON(normalizeRun(run))
	}
	_, err = termtext.Fprintln(inv.Stdout, run.ID)
	return err
}

// submitFlags are run submit's flags that describe the spec.
type submitFlags struct {
	image, gpuModel       *string
	memory, gpuMemory     bytesize.Value
	logLimit              bytesize.Value // retention: the log cap
	cpu                   *float64
	timeout, replaceAfter *time.Duration
	retries, gpus, count  *int
	nodes, masterPort     *int // a gang (docs/gpus.md)
	env, artifacts        command.StringList
	constraints           command.StringList
	// Containment the run asks for (api.RunSpec's block of it).
	user, network *string
	readOnly      *bool
	pidsLimit     *int64
	secrets       secretflag.Flags
	// Teams (docs/teams.md): the project (default: the context's) and
	// the priority within it.
	project  *string
	priority *int
	grace    *time.Duration
	// set holds the names of the flags given on the command line.
	set map[string]bool
}

func (sf *submitFlags) define(fs *command.FlagSet) {
	sf.set = map[string]bool{}
	sf.image = fs.String("image", "", "image `REF` to run, with a tag or a digest (required)")
	sf.cpu = fs.Float64("cpu", 0, "CPU `cores` to limit the run to, e.g. 0.5 (0: the node's default, one core unless its operator says otherwise)")
	fs.Var(&sf.memory, "memory", "memory `size` limit, e.g. 64MiB or 1GB (not given: the node's default, 2 GiB unless its operator says otherwise)")
	sf.timeout = fs.Duration("timeout", 0, "fail the run this long after its container started, e.g. 30m (0: no timeout)")
	sf.retries = fs.Int("retries", 0, "further attempts a failed attempt may get")
	sf.gpus = fs.Int("gpus", 0, "number of whole GPUs the run needs (per member, with --nodes)")
	sf.nodes = fs.Int("nodes", 1, "`N` members of a gang, one per node, placed all at once or not at all, each with its rank in MERCATOR_RANK and RANK (docs/gpus.md)")
	sf.masterPort = fs.Int("master-port", 0, "a gang's rendezvous `port` on rank 0, MASTER_PORT (0: 29500)")
	sf.gpuModel = fs.String("gpu-model", "", "GPU `model` the run needs, matched as a case-insensitive substring, e.g. H100")
	fs.Var(&sf.gpuMemory, "gpu-memory", "minimum memory `size` per GPU, e.g. 80GiB")
	fs.Var(&sf.logLimit, "log-limit", "keep at most this `size` of each attempt's log, e.g. 1GiB; past it output is dropped (not given: the server's default, 100MiB)")
	sf.replaceAfter = fs.Duration("replace-after", 0, "replace an attempt whose node has been unreachable this long, e.g. 10m (0: the default, 5m; negative: never)")
	fs.Var(&sf.env, "env", "set `KEY=VALUE` in the container's environment (repeatable; stored and shown in the clear: not for secrets, see --secret)")
	fs.Var(&sf.artifacts, "artifact", "mount an Artifact read-only: `NAME[@VERSION]:/PATH[:min-read=500MB/s]` (repeatable; no VERSION: the newest)")
	sf.user = fs.String("user", "", "run the command as `USER`: uid[:gid] or a name the image defines (default the image's user)")
	sf.readOnly = fs.Bool("read-only", false, "mount the container's root filesystem read-only")
	sf.network = fs.String("network", "", "`none` for loopback only, host for a gang's members only (default the node's bridge)")
	sf.pidsLimit = fs.Int64("pids-limit", 0, "most `processes` the container may have (0: the node's limit; a node refuses more than its --max-pids)")
	sf.count = fs.Int("count", 1, "submit `N` copies, each with "+runIndexEnv+"=0…N-1 in its environment, through the batch API")
	sf.secrets.Define(fs.FlagSet)
	sf.project = fs.String("project", "", "`project` the run belongs to and counts against (default: $MERCATOR_PROJECT, the context's, else default)")
	sf.priority = fs.Int("priority", 0, "`N`: higher runs first within its project, and may preempt lower in the same project")
	fs.Var(&sf.constraints, "constraint", "run only on nodes labelled `KEY=VALUE` (repeatable; see `mercator node label`)")
	sf.grace = fs.Duration("grace", 0, "time between SIGTERM and SIGKILL when the run is stopped (preempted, cancelled), e.g. 30s (0: 10s; at most the server's maximum)")
}

// spec builds the run spec the flags and command describe (a bare
// --secret NAME read from env), and checks it with api.RunSpec.Validate,
// the control plane's own checks, so that a spec the control plane would
// refuse is a usage error that names the flag to change, and no request is
// sent.
func (sf *submitFlags) spec(argv []string, env func(string) string) (api.RunSpec, error) {
	spec := api.RunSpec{Image: *sf.image, Command: argv, CPU: *sf.cpu, Retries: *sf.retries,
		GPUs: *sf.gpus, GPUModel: *sf.gpuModel, TimeoutSeconds: wholeSeconds(*sf.timeout),
		User: *sf.user, ReadOnlyRootfs: *sf.readOnly, Network: *sf.network, PidsLimit: *sf.pidsLimit,
		MemoryBytes: int64(sf.memory), GPUMemoryBytes: int64(sf.gpuMemory), LogLimitBytes: int64(sf.logLimit),
		Project: *sf.project, Priority: *sf.priority, GraceSeconds: wholeSeconds(*sf.grace),
		Nodes: *sf.nodes, MasterPort: *sf.masterPort}
	if spec.Nodes == 1 {
		spec.Nodes = 0 // one container, as the API stores it
	}
	var err error
	if *sf.replaceAfter < 0 {
		spec.ReplaceAfterSeconds = -1
	} else {
		spec.ReplaceAfterSeconds = wholeSeconds(*sf.replaceAfter)
	}
	if *sf.count < 1 {
		return spec, command.Usagef("--count must be 1 or more, got %d", *sf.count)
	}
	if spec.Env, err = command.KeyValues("env", sf.env, "the value may be empty: KEY="); err != nil {
		return spec, err
	}
	if spec.Constraints, err = command.KeyValues("constraint", sf.constraints, "write KEY=VALUE"); err != nil {
		return spec, err
	}
	if _, ok := spec.Env[runIndexEnv]; ok && sf.set["count"] {
		return spec, command.Usagef("--env %s cannot be combined with --count: --count sets %s to each copy's index, 0 to N-1", runIndexEnv, runIndexEnv)
	}
	if spec.Secrets, err = sf.secrets.Read(env); err != nil {
		return spec, command.Usagef("%v", err)
	}
	for _, a := range sf.artifacts {
		m, err := parseArtifactFlag(a)
		if err != nil {
			return spec, command.Usagef("%v", err)
		}
		spec.Artifacts = append(spec.Artifacts, m)
	}
	spec = spec.Normalized()
	return spec, specUsageError(spec.Validate())
}

// wholeSeconds rounds d away from zero to whole seconds, so that a
// positive duration is never cut to 0 (no limit) and a negative one is
// never rounded up to 0.
func wholeSeconds(d time.Duration) int64 {
	if d < 0 {
		return int64(math.Floor(d.Seconds()))
	}
	return int64(math.Ceil(d.Seconds()))
}

// specFlags names the run submit flag behind each field of api.RunSpec.
var specFlags = map[string]string{
	"image": "--image", "command": "the command", "cpu": "--cpu", "memory_bytes": "--memory",
	"timeout_seconds": "--timeout (in seconds)", "retries": "--retries", "gpus": "--gpus",
	"gpu_model": "--gpu-model", "gpu_memory_bytes": "--gpu-memory",
	"replace_after_seconds": "--replace-after (in seconds)", "env": "--env", "secrets": "--secret", "log_limit_bytes": "--log-limit",
	"user": "--user", "network": "--network", "pids_limit": "--pids-limit", "project": "--project", "priority": "--priority",
	"grace_seconds": "--grace (in seconds)", "constraints": "--constraint",
	"nodes": "--nodes", "master_port": "--master-port",
}

// specUsageError turns api.RunSpec.Validate's error into a usage error
// that names the flag instead of the JSON field ("--cpu must be …").
func specUsageError(err error) error {
	var fe *failure.Error
	if err == nil || !errors.As(err, &fe) {
		return err
	}
	name, ok := specFlags[fe.Field]
	if !ok {
		return command.Usagef("%v", err)
	}
	for _, verb := range []string{"is ", "are ", "has ", "must "} {
		if strings.HasPrefix(fe.Message, verb) {
			return command.Usagef("%s %s", name, fe.Message)
		}
	}
	return command.Usagef("%s: %s", name, fe.Message)
}

// runIndexEnv is the variable `run submit --count` sets to each copy's
// index, so one image can tell which part of a sweep it is.
const runIndexEnv = "MERCATOR_RUN_INDEX"

// submitCopies submits n copies of spec, copy i with runIndexEnv=i, in
// calls of at most api.MaxRunBatch (client.SubmitRuns), in index order.
// Without asJSON, each call's run IDs are printed on stdout as soon as it
// returns, so whatever was created is on stdout whatever happens next;
// with asJSON, the runs created are printed as one api.RunList at the end,
// failure or not. A failed call ends it: stderr then says how many runs
// were created and which indexes were not, and the call's error is
// returned.
func submitCopies(ctx context.Context, inv *command.Invocation, c *client.Client, spec api.RunSpec, n int, asJSON bool) error {
	created := api.RunList{Runs: []api.Run{}}
	var failed error
	for first := 0; first < n; first += api.MaxRunBatch {
		specs := indexedCopies(spec, first, min(api.MaxRunBatch, n-first))
		runs, err := keyed(ctx, inv, func(key client.SubmitOption) ([]api.Run, error) { return c.SubmitRuns(ctx, specs, key) })
		if err != nil {
			failed = err
			break
		}
		for _, r := range runs {
			created.Runs = append(created.Runs, normalizeRun(r))
			if !asJSON {
				if _, err := termtext.Fprintln(inv.Stdout, r.ID); err != nil {
					return err
				}
			}
		}
	}
	if asJSON {
		if err := inv.WriteJSON(created); err != nil {
			return err
		}
	}
	if failed != nil && len(created.Runs) > 0 {
		where := "on stdout, one per line"
		if asJSON {
			where = "on stdout, as JSON"
		}
		termtext.Fprintf(inv.Stderr, "%d of %d runs were created (indexes 0 to %d; their IDs are %s); indexes %d to %d were not\n",
			len(created.Runs), n, len(created.Runs)-1, where, len(created.Runs), n-1)
	}
	return failed
}

// submitTries is how many times a submission is sent while its answer is
// lost (failure.ErrUnavailable: the control plane unreachable, or gone
// mid-call), a second, then two, apart.
const submitTries = 3

// keyed sends a submission under a fresh idempotency key, and again under
// the same key while its answer is lost: a call that reached a replica
// which committed it and then died is answered, on the retry, with the
// runs it created, so a flaky connection never doubles a training run.
func keyed[T any](ctx context.Context, inv *command.Invocation, submit func(client.SubmitOption) (T, error)) (T, error) {
	key := client.IdempotencyKey(client.NewIdempotencyKey())
	for try := 1; ; try++ {
		v, err := submit(key)
		if err == nil || !errors.Is(err, failure.ErrUnavailable) || try == submitTries {
			return v, err
		}
		wait := time.Duration(1<<(try-1)) * time.Second
		termtext.Fprintf(inv.Stderr, "%v; sending the submission again in %v (under the same idempotency key, so it is created once)\n", err, wait)
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(wait):
		}
	}
}

// indexedCopies is n copies of spec for indexes first to first+n-1, each
// with its own environment holding runIndexEnv=index. spec is not changed.
func indexedCopies(spec api.RunSpec, first, n int) []api.RunSpec {
	out := make([]api.RunSpec, n)
	for i := range out {
		env := maps.Clone(spec.Env)
		if env == nil {
			env = map[string]string{}
		}
		env[runIndexEnv] = strconv.Itoa(first + i)
		out[i] = spec
		out[i].Env = env
	}
	return out
}

// normalizeRun makes empty lists print as [] rather than null in JSON.
func normalizeRun(r api.Run) api.Run {
	if r.Attempts == nil {
		r.Attempts = []api.Attempt{}
	}
	return r
}

func runGet(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] RUN_ID", `
Show a run: its status and why, its image as submitted and as pinned, its
exit code and moments, then each attempt: the node it was placed on, its
status, its container, when the container started and finished (the
daemon's own moments), its exit code and error.`)
	g := fs.ClientFlags(true)
	c, id, err := inv.Connect(fs, g, args, "RUN_ID")
	if err != nil {
		return err
	}
	run, err := c.GetRun(ctx, id)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(normalizeRun(run))
	}
	return printRun(inv, run)
}

func printRun(inv *command.Invocation, r api.Run) error {
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	row := func(k, v string) { termtext.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("ID", r.ID)
	status := r.Status
	if r.Cancel && !api.Terminal(r.Status) {
		status += " (cancel requested)"
	}
	row("Status", status)
	row("Reason", command.OrDash(r.Reason))
	row("Project", fmt.Sprintf("%s (priority %d)", api.ProjectOf(r.Project), r.Priority))
	if r.Queue != nil {
		row("Queue", describeQueue(*r.Queue))
	}
	row("Image", command.OrDash(r.Image))
	row("Pinned image", command.OrDash(r.PinnedImage))
	if len(r.Command) > 0 {
		row("Command", strings.Join(r.Command, " "))
	}
	row("Exit code", command.FormatExit(r.ExitCode))
	row("Created", command.FormatTime(&r.CreatedAt))
	finished := command.FormatTime(r.FinishedAt)
	if r.FinishedAt != nil && !r.CreatedAt.IsZero() {
		finished += " (after " + command.FormatDuration(r.FinishedAt.Sub(r.CreatedAt)) + ")"
	}
	row("Finished", finished)
	if err := tw.Flush(); err != nil {
		return err
	}
	termtext.Fprintln(inv.Stdout)
	if len(r.Attempts) == 0 {
		_, err := fmt.Fprintln(inv.Stdout, "No attempts yet.")
		return err
	}
	if err := printMembers(inv, r); err != nil { // gang.go
		return err
	}
	tw = tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTEMPT\tNODE\tSTATUS\tCONTAINER\tSTARTED\tFINISHED\tEXIT\tERROR")
	for _, a := range r.Attempts {
		exit := command.FormatExit(a.ExitCode)
		if a.OOMKilled {
			exit += " (OOM)"
		}
		errText := a.Error
		if a.StopReason != "" {
			errText = strings.TrimSpace(errText + " (stopped: " + a.StopReason + ")")
		}
		if a.PreemptedBy != "" {
			errText = a.PreemptedBy
		}
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", attemptLabel(a), command.OrDash(a.NodeID), a.Status,
			command.OrDash(shortID(a.ContainerID)), command.FormatTime(a.StartedAt), command.FormatTime(a.FinishedAt), exit, command.OrDash(errText))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printGPUUsage(inv, r.Attempts) // gpu.go
}

// shortID shortens a container ID the way docker ps does.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func runList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags]", `
List runs, newest first. --status keeps runs in the given statuses
(repeatable or comma-separated: queued, placed, preparing, running,
succeeded, failed, cancelled). Page with --limit and --before, passing the
ID of the last run of the previous page.`)
	g := fs.ClientFlags(true)
	var statuses command.StringList
	fs.Var(&statuses, "status", "keep runs with this `status` (repeatable, or comma-separated)")
	limit := fs.Int("limit", 0, "list at most `N` runs (0: the server's default)")
	before := fs.String("before", "", "list only runs older than `RUN_ID`")
	project := fs.String("project", "", "list only this `project`'s runs (default: $MERCATOR_PROJECT or the context's; every project when neither)")
	queue := fs.Bool("queue", false, "list the queued runs in the order the scheduler would take them (across projects by fair share; within one by priority, then submission), with their positions")
	pos, err := fs.Parse(args)
	if err != nil {
		return err
	}
	if err := g.Check(); err != nil {
		return err
	}
	if len(pos) > 0 {
		return command.Usagef("unexpected argument %q", pos[0])
	}
	if *limit < 0 {
		return command.Usagef("--limit must not be negative, got %d", *limit)
	}
	opts := client.ListRunsOptions{Limit: *limit, Before: *before, Project: *project, Queue: *queue}
	for _, s := range statuses {
		for _, one := range strings.Split(s, ",") {
			one = strings.TrimSpace(one)
			if one == "" {
				continue
			}
			if !knownRunStatus(one) {
				return command.Usagef("--status %q is not a run status; use queued, placed, preparing, running, succeeded, failed or cancelled", one)
			}
			opts.Statuses = append(opts.Statuses, one)
		}
	}
	c, err := inv.Client(g)
	if err != nil {
		return err
	}
	if opts.Project == "" {
		opts.Project = c.Project
	}
	list, err := c.ListRuns(ctx, opts)
	if err != nil {
		return err
	}
	if g.JSON() {
		for i := range list.Runs {
			list.Runs[i] = normalizeRun(list.Runs[i])
		}
		return inv.WriteJSON(list)
	}
	if *queue {
		return printQueue(inv, list)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tIMAGE\tEXIT\tCREATED\tFINISHED\tREASON")
	for _, r := range list.Runs {
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Status, command.OrDash(r.Image), command.FormatExit(r.ExitCode),
			command.FormatTime(&r.CreatedAt), command.FormatTime(r.FinishedAt), command.OrDash(r.Reason))
	}
	return tw.Flush()
}

func knownRunStatus(s string) bool {
	switch s {
	case api.RunQueued, api.RunPlaced, api.RunPreparing, api.RunRunning, api.RunSucceeded, api.RunFailed, api.RunCancelled:
		return true
	}
	return false
}

// Exit statuses of `run wait` that are not the run's own exit code.
const (
	exitFailedNoCode = 1   // failed without an exit code (never started, lost)
	exitCancelled    = 130 // cancelled, as a shell reports a SIGINT'd command
)

func runWait(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] RUN_ID", `
Wait until the run ends, print a one-line summary to stderr, and exit with
the run's status, so that a script can chain on the run itself (on a
terminal, stderr also shows each stage the run reaches: queued and why,
placed, preparing on its node, running):

    mercator run wait "$id" && echo done

Exit status:
  the run's exit code   when the run ended with one (0: succeeded). A run
                        that failed or was cancelled never exits 0: if its
                        code was 0 or outside 1-255, it exits 1 (failed) or
                        130 (cancelled) instead
  1                     the run failed without an exit code (its container
                        could not start or was lost), or the control plane
                        answered with an error
  130                   the run was cancelled without an exit code, or the
                        wait was interrupted (the run goes on)
  2                     the command line was wrong

With -o json the run as it ended is printed on stdout as well.`)
	g := fs.ClientFlags(true)
	c, id, err := inv.Connect(fs, g, args, "RUN_ID")
	if err != nil {
		return err
	}
	return waitForRun(ctx, inv, c, id, g.JSON())
}

// waitExitCode is the exit status of `run wait` for a terminal run; see its
// help for the rules.
func waitExitCode(r api.Run) int {
	switch r.Status {
	case api.RunSucceeded:
		return 0
	case api.RunCancelled:
		if r.ExitCode != nil && *r.ExitCode > 0 && *r.ExitCode <= 255 {
			return *r.ExitCode
		}
		return exitCancelled
	default: // failed
		if r.ExitCode != nil && *r.ExitCode > 0 && *r.ExitCode <= 255 {
			return *r.ExitCode
		}
		return exitFailedNoCode
	}
}

// runSummaryLine is "run r-1 succeeded (exit 0) in 1.2s", with the reason
// after a colon when the run has one.
func runSummaryLine(r api.Run) string {
	var b strings.Builder
	termtext.Fprintf(&b, "run %s %s", r.ID, r.Status)
	if r.ExitCode != nil {
		termtext.Fprintf(&b, " (exit %d)", *r.ExitCode)
	}
	if r.FinishedAt != nil && !r.CreatedAt.IsZero() {
		termtext.Fprintf(&b, " in %s", command.FormatDuration(r.FinishedAt.Sub(r.CreatedAt)))
	}
	if r.Reason != "" {
		termtext.Fprintf(&b, ": %s", r.Reason)
	}
	return b.String()
}

func runLogs(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] RUN_ID", `
Print the combined stdout and stderr of the run's latest attempt (of a
gang, rank 0's or --rank K's in its latest attempt set) as it arrives. With -f, keep printing until the run ends and all its output was
printed. To a file or a pipe it is byte for byte; to a terminal, its control
characters and escape sequences are shown escaped (\x1b[2J), not obeyed,
unless --raw is given (docs/hardening.md, "Terminal output").`)
	g := fs.ClientFlags(false)
	follow := fs.Bool("follow", false, "keep streaming until the run ends")
	fs.AliasShort("f", "follow")
	rank := fs.Int("rank", -1, "a gang's member `K`, in its latest attempt set (default: rank 0 of a gang)")
	raw := command.RawFlag(fs)
	c, id, err := inv.Connect(fs, g, args, "RUN_ID")
	if err != nil {
		return err
	}
	w, finish := termtext.Output(inv.Stdout, *raw)
	if *rank < -1 {
		return command.Usagef("--rank must be a gang's rank, 0 or more; got %d", *rank)
	}
	if *rank >= 0 {
		return finish(c.RankLogs(ctx, id, *rank, *follow, w))
	}
	return finish(c.Logs(ctx, id, *follow, w))
}

func runCancel(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] RUN_ID", `
Ask the control plane to cancel a run. Cancelling is asynchronous: the
run's container is stopped on its node, and the run ends as cancelled; use
'mercator run wait' to see it end.`)
	g := fs.ClientFlags(true)
	c, id, err := inv.Connect(fs, g, args, "RUN_ID")
	if err != nil {
		return err
	}
	run, err := c.CancelRun(ctx, id)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(normalizeRun(run))
	}
	_, err = termtext.Fprintf(inv.Stdout, "run %s: cancel requested (status %s)\n", run.ID, run.Status)
	return err
}

// durationSince is how long ago t was, for "last seen" columns.
func durationSince(inv *command.Invocation, t *time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	return command.FormatDuration(inv.Now().Sub(*t).Truncate(time.Second)) + " ago"
}
