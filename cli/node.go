package cli

import (
	"time"

	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/internal/termtext"

	"github.com/mercator/mercator/api"
)

const nodeSummary = "Invite, list and inspect nodes"

func init() {
	registerSub("node", nodeSummary, &command.Command{Name: "invite", Summary: "Mint a single-use invitation for a node to enroll", Run: nodeInvite})
	registerSub("node", nodeSummary, &command.Command{Name: "ls", Summary: "List nodes", Run: nodeList})
	registerSub("node", nodeSummary, &command.Command{Name: "get", Summary: "Show a node and the facts it reported", Run: nodeGet})
	registerSub("node", nodeSummary, &command.Command{Name: "cordon", Summary: "Place no new work on a node", Run: nodeCordon})
	registerSub("node", nodeSummary, &command.Command{Name: "uncordon", Summary: "Return a cordoned or draining node to service", Run: nodeUncordon})
	registerSub("node", nodeSummary, &command.Command{Name: "drain", Summary: "Cordon a node and, after an optional deadline, stop its work", Run: nodeDrain})
	registerSub("node", nodeSummary, &command.Command{Name: "gpu-clear", Summary: "Clear a GPU dispute: this node's claim to the GPU stands", Run: nodeGPUClear})
}

func nodeInvite(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NODE_ID", `
Mint a single-use invitation for the machine that will be NODE_ID, and
print its token and the exact command line to run on that machine: the
agent spends the invitation to enroll, connecting out to the control plane.
The token is a secret until it is spent or expires. -o json prints the
invitation object (node_id, token, expires_at, command).`)
	g := fs.ClientFlags(true)
	ttl := fs.Duration("ttl", 0, "how long the invitation may be spent, e.g. 24h (0: the server's default, 24h)")
	c, id, err := inv.Connect(fs, g, args, "NODE_ID")
	if err != nil {
		return err
	}
	if *ttl < 0 {
		return command.Usagef("--ttl must not be negative, got %s", *ttl)
	}
	invitation, err := c.InviteNode(ctx, id, *ttl)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(invitation)
	}
	expires := command.FormatTime(&invitation.ExpiresAt)
	if !invitation.ExpiresAt.IsZero() {
		expires += " (in " + command.FormatDuration(invitation.ExpiresAt.Sub(inv.Now())) + ")"
	}
	_, err = termtext.Fprintf(inv.Stdout, "Invitation for node %s, single use, expires %s.\n"+
		"Token: %s\n\n"+
		"Run this on the machine to enroll it:\n\n"+
		"  %s\n", invitation.NodeID, expires, invitation.Token, invitation.Command)
	return err
}

func nodeList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags]", `
List the nodes the control plane knows: invited, ready (enrolled and
inside their lease) and unreachable (past their lease).`)
	g := fs.ClientFlags(true)
	c, _, err := inv.Connect(fs, g, args, "")
	if err != nil {
		return err
	}
	list, err := c.ListNodes(ctx)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(list)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tCPUS\tMEMORY\tGPUS\tRUNNING\tLAST SEEN\tFLAGS\tAGENT\tCAP")
	for _, n := range list.Nodes {
		f := factsOf(n.Facts)
		// AGENT and CAP: the agent version and capability version its last
		// facts stated (docs/upgrades.md).
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", n.ID, n.Status, f.number("cpus"), f.bytes("memory_bytes"),
			gpuCount(n.GPUs), len(n.Running), durationSince(inv, n.LastSeenAt), len(n.Flags), command.OrDash(f.str("agent_version")), f.number("capability_version")) // gpuCount: gpu.go
	}
	return tw.Flush()
}

func nodeGet(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NODE_ID", `
Show a node: its status, fencing token (the enrollment commands must carry)
and when it was last seen, and the facts it last reported as it measured
them: CPUs, memory, free disk, the container runtime and its version, the
images it holds, its accelerators, its functions share (and whether its
function containers' output passes the Docker daemon or the agent's
output relay), and any notes about what it could not measure; then the flags the control plane raised about those facts (a
refused report, a disputed GPU: see docs/hardening.md, "Node facts").`)
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
		return inv.WriteJSON(n)
	}
	f := factsOf(n.Facts)
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	row := func(k, v string) { termtext.Fprintf(tw, "%s\t%s\n", labelOf(k), v) }
	row("ID", n.ID)
	row("Status", n.Status)
	row("Fencing token", strconv.FormatUint(n.FencingToken, 10))
	row("Enrolled", command.FormatTime(n.EnrolledAt))
	lastSeen := command.FormatTime(n.LastSeenAt)
	if n.LastSeenAt != nil {
		lastSeen += " (" + durationSince(inv, n.LastSeenAt) + ")"
	}
	row("Last seen", lastSeen)
	if n.Facts == nil {
		row("Facts", "none reported yet")
	} else {
		row("Hostname", command.OrDash(f.str("hostname")))
		row("OS/arch", command.OrDash(strings.Trim(f.str("os")+"/"+f.str("arch"), "/")))
		row("CPUs", f.number("cpus"))
		row("Memory", f.bytes("memory_bytes"))
		row("Disk free", f.bytes("disk_free_bytes"))
		runtime := strings.TrimSpace(f.str("runtime_name") + " " + f.str("runtime_version"))
		if v := f.str("runtime_api_version"); v != "" {
			runtime += " (API " + v + ")"
		}
		row("Runtime", command.OrDash(runtime))
		row("Images", strconv.Itoa(len(f.list("images"))))
		accs := f.list("accelerators")
		if len(accs) == 0 {
			row("Accelerators", "none")
		}
		for i, a := range accs {
			af := facts(asMap(a))
			desc := strings.TrimSpace(af.str("vendor") + " " + af.str("model"))
			if m := af.bytes("memory_bytes"); m != "-" {
				desc += ", " + m
			}
			if u := af.str("uuid"); u != "" {
				desc += ", " + u
			}
			row(firstOnly("Accelerators", i), desc)
		}
		row("Functions", functionsText(facts(asMap(f["functions"]))))
		row("Agent", strings.TrimSpace(command.OrDash(f.str("agent_version"))+", capability "+f.number("capability_version")))
		for i, note := range f.list("notes") {
			row(firstOnly("Notes", i), fmt.Sprint(note))
		}
	}
	running := "none"
	if len(n.Running) > 0 {
		running = strings.Join(n.Running, ", ")
	}
	row("Running", running)
	for i, gpu := range n.GPUs {
		row(firstOnly("GPU health", i), gpuHealthText(gpu)) // gpu.go
	}
	for i, fl := range n.Flags {
		row(firstOnly("Flags", i), flagText(fl))
	}
	return tw.Flush()
}

// functionsText is a node's functions share on a line, from its facts'
// "functions" (nodeproto.FunctionCapacity): the memory, CPUs and GPUs set
// aside, and whether the containers' output passes the Docker daemon or
// the agent's output relay (docs/functions.md, "Output past the daemon").
func functionsText(fc facts) string {
	if fc == nil {
		return "none (the agent runs no functions)"
	}
	cpus := "- CPUs"
	if m, ok := fc.float("milli_cpus"); ok && m == 1000 {
		cpus = "1 CPU"
	} else if ok {
		cpus = strconv.FormatFloat(m/1000, 'f', -1, 64) + " CPUs"
	}
	text := fc.bytes("memory_bytes") + " memory, " + cpus
	switch gpus := fc.list("gpus"); len(gpus) {
	case 0:
	case 1:
		text += ", 1 GPU"
	default:
		text += fmt.Sprintf(", %d GPUs", len(gpus))
	}
	if v, _ := fc["output_relay"].(bool); v {
		return text + "; output through the agent's relay"
	}
	return text + "; output through the Docker daemon"
}

// flagText is one of a node's flags on a line: its kind, the GPU it
// concerns, since when, and what was found.
func flagText(f api.NodeFlag) string {
	kind := f.Kind
	if f.GPU != "" {
		kind += " " + f.GPU
	}
	return kind + " (since " + command.FormatTime(&f.Since) + "): " + f.Detail
}

// labelOf is a detail row's label: "K:", or nothing for a row that
// continues the one above (firstOnly).
func labelOf(k string) string {
	if k == "" {
		return ""
	}
	return k + ":"
}

// firstOnly is label on a list's first row (i == 0) and "" on the rest.
func firstOnly(label string, i int) string {
	if i > 0 {
		return ""
	}
	return label
}

// facts reads fields of a node's reported facts, which arrive as a generic
// JSON object (api.NodeFactsDoc): the CLI shows what the node sent even when
// it is newer than this binary.
type facts map[string]any

// factsOf reads a node's facts; nil (none reported) reads as empty.
func factsOf(p *api.NodeFactsDoc) facts {
	if p == nil {
		return nil
	}
	return facts(*p)
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func (f facts) str(k string) string {
	switch v := f[k].(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

func (f facts) float(k string) (float64, bool) {
	v, ok := f[k].(float64)
	return v, ok
}

// number prints a numeric fact without a trailing ".0", or "-".
func (f facts) number(k string) string {
	v, ok := f.float(k)
	if !ok {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// bytes prints a byte-count fact in binary units, or "-" when unmeasured.
func (f facts) bytes(k string) string {
	v, ok := f.float(k)
	if !ok || v <= 0 || v > math.MaxInt64 {
		return "-"
	}
	return bytesize.Format(int64(v))
}

func (f facts) list(k string) []any {
	l, _ := f[k].([]any)
	return l
}

func nodeCordon(ctx context.Context, inv *command.Invocation, args []string) error {
	return nodeAction(ctx, inv, args, `
Cordon a node: the scheduler places no new work on it; what runs there goes
on. Undo with `+"`mercator node uncordon`"+`.`, nil, func(c *client.Client, id string) (api.Node, error) { return c.CordonNode(ctx, id) })
}

func nodeUncordon(ctx context.Context, inv *command.Invocation, args []string) error {
	return nodeAction(ctx, inv, args, `
Return a cordoned or draining node to service.`, nil, func(c *client.Client, id string) (api.Node, error) { return c.UncordonNode(ctx, id) })
}

func nodeDrain(ctx context.Context, inv *command.Invocation, args []string) error {
	var deadline *time.Duration
	var wait *bool
	return nodeAction(ctx, inv, args, `
Drain a node: no new work is placed on it and running work may finish. With
--deadline, work still running when it passes is stopped (reason "drained"),
and each stopped run's retry policy decides whether it is placed elsewhere.
With --wait, it returns once nothing is left on the node (no runs, no
function containers), showing what is left as it changes when stderr is a
terminal.`,
		func(fs *command.FlagSet) {
			deadline = fs.Duration("deadline", 0, "stop remaining work after this `duration`, e.g. 1h (0: none)")
			wait = fs.Bool("wait", false, "wait until nothing is left on the node, showing what is left")
		},
		func(c *client.Client, id string) (api.Node, error) {
			if *deadline < 0 {
				return api.Node{}, command.Usagef("--deadline must not be negative, got %s", *deadline)
			}
			n, err := c.DrainNode(ctx, id, *deadline)
			if err == nil && *wait {
				n, err = waitDrained(ctx, inv, c, n) // node_drain.go
			}
			return n, err
		})
}

func nodeGPUClear(ctx context.Context, inv *command.Invocation, args []string) error {
	return nodeGPUAction(ctx, inv, args, `
Clear the dispute over GPU_UUID on NODE_ID. When two nodes report the same
GPU UUID, neither gets work on that GPU until an operator has looked: find
out which machine really holds the device (nvidia-smi -L on each), run this
for the node whose claim stands, and remove or re-enroll the other (its
dispute stays until then). `+"`mercator node get NODE_ID`"+` lists a node's flags.`,
		"dispute cleared: it may be placed on again", (*client.Client).ClearGPUDispute) // gpu.go
}

// nodeAction is the shape of cordon, uncordon and drain: flags, one node ID,
// one call, the node printed as it now is.
func nodeAction(ctx context.Context, inv *command.Invocation, args []string, help string, extra func(*command.FlagSet), call func(*client.Client, string) (api.Node, error)) error {
	fs := inv.Flags("[flags] NODE_ID", help)
	g := fs.ClientFlags(true)
	if extra != nil {
		extra(fs)
	}
	c, id, err := inv.Connect(fs, g, args, "NODE_ID")
	if err != nil {
		return err
	}
	n, err := call(c, id)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(n)
	}
	state := "in service"
	switch {
	case n.RemovedAt != nil:
		state = "removed: its credentials are void, its agent stops, and its work is treated as on an unreachable node"
	case n.Draining && n.DrainDeadline != nil:
		state = "draining; remaining work stops at " + n.DrainDeadline.Format(time.RFC3339)
	case n.Draining:
		state = "draining; running work may finish"
	case n.Cordoned:
		state = "cordoned"
	}
	_, err = termtext.Fprintf(inv.Stdout, "node %s: %s (%d attempts on it)\n", n.ID, state, len(n.Running))
	return err
}
