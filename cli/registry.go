package cli

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/internal/termtext"
)

// This file holds `mercator registry …`: credentials for private image
// registries, stored sealed on the control plane and never shown again.

const registrySummary = "Store credentials for private image registries"

func init() {
	registerSub("registry", registrySummary, &command.Command{Name: "add", Summary: "Store a registry credential (password from stdin)", Run: registryAdd})
	registerSub("registry", registrySummary, &command.Command{Name: "ls", Summary: "List registries with a stored credential", Run: registryList})
	registerSub("registry", registrySummary, &command.Command{Name: "rm", Summary: "Remove a registry credential", Run: registryRemove})
}

func registryAdd(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] HOST --username USER --password-stdin", `
Store the credential Mercator uses to pull images from HOST (as image
references name it: ghcr.io, registry.example.com:5000, docker.io) and to
resolve their tags at submit. The password, or token, is read from stdin, so
it appears in no command line or shell history:

    mercator registry add ghcr.io --username bot --password-stdin < token

It is stored encrypted and never returned. A node receives it only inside
the command that pulls the image, and keeps it nowhere. Adding a host again
replaces its credential.

A credential belongs to a project: only that project's runs and functions
pull with it, and each project may hold its own for the same host.`)
	g := fs.ClientFlags(true)
	project := projectFlag(fs, "whose runs and functions pull with it")
	user := fs.String("username", "", "registry `user` name (required)")
	stdin := fs.Bool("password-stdin", false, "read the password or token from stdin (required)")
	pos, err := fs.Parse(args)
	if err != nil {
		return err
	}
	if err := g.Check(); err != nil {
		return err
	}
	host, err := command.OneArg(pos, "HOST")
	if err != nil {
		return err
	}
	if *user == "" {
		return command.Usagef("--username is required")
	}
	if !*stdin {
		return command.Usagef("--password-stdin is required: the password is read from stdin, never from a flag")
	}
	line, err := bufio.NewReader(inv.Stdin).ReadString('\n')
	password := strings.TrimRight(line, "\r\n")
	if password == "" {
		if err != nil {
			return fmt.Errorf("reading the password from stdin: nothing was given (%v)", err)
		}
		return fmt.Errorf("the password read from stdin is empty")
	}
	c, err := inv.Client(g)
	if err != nil {
		return err
	}
	r, err := c.AddRegistryTo(ctx, projectOr(c, *project), host, *user, password)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(r)
	}
	termtext.Fprintf(inv.Stderr, "stored project %s's credential of %s for user %s\n", r.Project, r.Host, r.Username)
	return nil
}

func registryList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags]", `List the registries with a stored credential, by project. Passwords are never shown.`)
	g := fs.ClientFlags(true)
	project := projectFlag(fs, "whose credentials to list")
	c, _, err := inv.Connect(fs, g, args, "")
	if err != nil {
		return err
	}
	list, err := c.ListRegistriesOf(ctx, projectOr(c, *project))
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(list)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECT\tHOST\tUSERNAME\tUPDATED")
	for _, r := range list.Registries {
		updated := r.UpdatedAt
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Project, r.Host, r.Username, command.FormatTime(&updated))
	}
	return tw.Flush()
}

func registryRemove(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] HOST", `Remove a project's credential of a registry host.`)
	g := fs.ClientFlags(false)
	project := projectFlag(fs, "whose credential to remove")
	c, host, err := inv.Connect(fs, g, args, "HOST")
	if err != nil {
		return err
	}
	r, err := c.RemoveRegistryFrom(ctx, projectOr(c, *project), host)
	if err != nil {
		return err
	}
	termtext.Fprintf(inv.Stderr, "removed project %s's credential of %s\n", r.Project, r.Host)
	return nil
}
