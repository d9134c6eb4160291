package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/termtext"
)

// This file holds `mercator token …` (named API credentials with roles),
// `mercator audit ls`, and the node commands that revoke: `node rm` and
// `node invitations`.

const tokenSummary = "Create, list and remove named API credentials with roles"

func init() {
	registerSub("token", tokenSummary, &command.Command{Name: "create", Summary: "Create a named credential with a role; prints its secret once", Run: tokenCreate})
	registerSub("token", tokenSummary, &command.Command{Name: "ls", Summary: "List named credentials (never their secrets)", Run: tokenList})
	registerSub("token", tokenSummary, &command.Command{Name: "rm", Summary: "Remove a named credential; refused at once everywhere", Run: tokenRemove})
	registerSub("audit", "Read the audit log", &command.Command{Name: "ls", Summary: "List audit entries, newest first", Run: auditList})
	registerSub("node", nodeSummary, &command.Command{Name: "rm", Summary: "Remove a node: end its credentials at once and stop its agent", Run: nodeRemove})
	registerSub("node", nodeSummary, &command.Command{Name: "invitations", Summary: "List a node's invitations", Run: nodeInvitations})
}

func tokenCreate(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NAME --role ROLE", `
Create a named API credential and print its secret, once, alone on stdout
(-o json: {"name": …, "token": …}). The roles:

  reader     every GET except secrets
  submitter  reader + runs, Artifact pushes, function invocation
  operator   submitter + nodes, invitations, registries, apps, fns, triggers
  admin      everything, tokens and the audit log included
  invoker    with --app APP: that app's functions and triggers, nothing else

The control plane keeps only the secret's hash. Remove it with
`+"`mercator token rm NAME`"+`.`)
	g := fs.ClientFlags(true)
	role := fs.String("role", "", "the credential's `role`: reader, submitter, operator, admin or invoker (required)")
	app := fs.String("app", "", "the `app` an invoker may call (role invoker only)")
	var projects command.StringList
	fs.Var(&projects, "project", "confine the credential to this `project`'s runs and records (repeatable; not for admin or invoker; default every project)")
	var expires time.Duration
	fs.Var(command.SpanFlag(&expires), "expires", "the credential's `life`, e.g. 30d or 12h (default: it never expires)")
	c, name, err := inv.Connect(fs, g, args, "NAME")
	if err != nil {
		return err
	}
	if *role == "" {
		return command.Usagef("--role is required: reader, submitter, operator, admin, or invoker with --app")
	}
	out, err := c.CreateToken(ctx, api.TokenRequest{Name: name, Role: *role, App: *app, ExpiresSeconds: int64(expires.Round(time.Second) / time.Second),
		Projects: projects})
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(struct {
			Name  string `json:"name"`
			Token string `json:"token"`
		}{out.Name, out.Secret})
	}
	termtext.Fprintf(inv.Stderr, "token %s (%s) created; its secret is shown only now:\n", out.Name, out.Role)
	_, err = termtext.Fprintln(inv.Stdout, out.Secret)
	return err
}

func tokenList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags]", `
List the named API credentials: name, role (and an invoker's app), when
each was created, last used (recorded at most once a minute) and expires.
Never their secrets.`)
	g := fs.ClientFlags(true)
	c, _, err := inv.Connect(fs, g, args, "")
	if err != nil {
		return err
	}
	list, err := c.ListTokens(ctx)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(list)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tROLE\tAPP\tCREATED\tLAST USED\tEXPIRES")
	for _, t := range list.Tokens {
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, t.Role, command.OrDash(t.App), command.FormatTime(&t.CreatedAt),
			durationSince(inv, t.LastUsedAt), command.FormatTime(t.ExpiresAt))
	}
	return tw.Flush()
}

func tokenRemove(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NAME", `
Remove a named credential: every replica refuses it from the next call.
The last admin credential cannot be removed; create another first.`)
	c, name, err := inv.Connect(fs, fs.ClientFlags(false), args, "NAME")
	if err != nil {
		return err
	}
	if err := c.RemoveToken(ctx, name); err != nil {
		return err
	}
	termtext.Fprintf(inv.Stderr, "token %s removed\n", name)
	return nil
}

func auditList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags]", `
List the audit log, newest first: every mutating call and every refused
credential, with when, who (a token's name, or node:ID), from where, what
(method, route, object) and the answer's status. Function invocations are
not recorded one by one; their refusals are. Admin only.`)
	g := fs.ClientFlags(true)
	var since time.Duration
	fs.Var(command.SpanFlag(&since), "since", "only entries of the last `span`, e.g. 1h or 7d")
	who := fs.String("who", "", "only entries of this `name` (a token's name, or node:ID)")
	limit := fs.Int("limit", 1000, "at most `N` entries (up to 10000)")
	c, _, err := inv.Connect(fs, g, args, "")
	if err != nil {
		return err
	}
	opts := client.AuditOptions{Who: *who, Limit: *limit}
	if since > 0 {
		opts.Since = inv.Now().Add(-since)
	}
	list, err := c.ListAudit(ctx, opts)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(list)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tWHO\tROLE\tFROM\tROUTE\tOBJECT\tSTATUS")
	for _, e := range list.Entries {
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", command.FormatTime(&e.At), command.OrDash(e.Who), command.OrDash(e.Role), command.OrDash(e.Remote),
			e.Route, command.OrDash(e.Object), e.Status)
	}
	return tw.Flush()
}

func nodeRemove(ctx context.Context, inv *command.Invocation, args []string) error {
	return nodeAction(ctx, inv, args, `
Remove a node: its sessions and unused invitations end at once, it is
fenced (its agent stops, saying this command removed it), and its work is
treated as on an unreachable node (replaced after its replace_after).
`+"`mercator node invite NODE_ID`"+` brings it back.`, nil, func(c *client.Client, id string) (api.Node, error) { return c.RemoveNode(ctx, id) })
}

func nodeInvitations(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NODE_ID", `
List a node's invitations, oldest first: unused, spent or expired. Never
their tokens. A new `+"`mercator node invite`"+` revokes the older unused ones.`)
	g := fs.ClientFlags(true)
	c, id, err := inv.Connect(fs, g, args, "NODE_ID")
	if err != nil {
		return err
	}
	list, err := c.ListInvitations(ctx, id)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(list)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tCREATED\tEXPIRES\tSPENT")
	for _, i := range list.Invitations {
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", i.ID, i.Status, command.FormatTime(&i.CreatedAt), command.FormatTime(&i.ExpiresAt), command.FormatTime(i.SpentAt))
	}
	return tw.Flush()
}
