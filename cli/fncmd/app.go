package fncmd

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/internal/termtext"
)

// `mercator app …`: Fn's applications, through the Fn-compatible API. The
// verbs follow the Fn CLI's (create, list, inspect, update, delete) with
// Mercator's spelling (ls, get).

// registerApp adds `mercator app …` through registerSub (see Register).
func registerApp(registerSub func(group, groupSummary string, c *command.Command)) {
	const group = "Manage function applications (Fn-compatible apps)"
	registerSub("app", group, &command.Command{Name: "create", Summary: "Create an app", Run: appCreate})
	registerSub("app", group, &command.Command{Name: "ls", Summary: "List apps", Run: appList})
	registerSub("app", group, &command.Command{Name: "get", Summary: "Show an app", Run: appGet})
	registerSub("app", group, &command.Command{Name: "update", Summary: "Change an app's configuration or annotations", Run: appUpdate})
	registerSub("app", group, &command.Command{Name: "delete", Summary: "Delete an app with its functions and triggers", Run: appDelete})
}

// configFlags are the repeatable --config, --secret and --annotation flags
// of app and function commands.
type configFlags struct {
	config, secret, annotation command.StringList
}

func defineConfigFlags(f *command.FlagSet) *configFlags {
	c := &configFlags{}
	f.Var(&c.config, "config", "set `KEY=VALUE` in the configuration, passed to the function as environment (repeatable; KEY= removes it)")
	f.Var(&c.secret, "secret", "set `KEY=VALUE` in the secret configuration, which is never shown again (repeatable; KEY= removes it)")
	f.Var(&c.annotation, "annotation", "set annotation `KEY=JSON` (repeatable; a value that is not JSON is taken as a string; KEY= removes it)")
	return c
}

// maps returns the flags as the API's maps; nil for flags not given.
func (c *configFlags) maps() (config, secret map[string]string, ann api.Annotations, err error) {
	const removes = "KEY= removes the key"
	if config, err = command.KeyValues("config", c.config, removes); err != nil {
		return
	}
	if secret, err = command.KeyValues("secret", c.secret, removes); err != nil {
		return
	}
	raw, err := command.KeyValues("annotation", c.annotation, removes)
	if err != nil || raw == nil {
		return
	}
	ann = api.Annotations{}
	for k, v := range raw {
		if v == "" {
			ann[k] = json.RawMessage(`""`)
			continue
		}
		if json.Valid([]byte(v)) {
			ann[k] = json.RawMessage(v)
			continue
		}
		b, _ := json.Marshal(v)
		ann[k] = b
	}
	return
}

// publicInvokeFlag adds --public-invoke[=false]. Its apply sets or removes
// the annotation in ann when the flag was given (after parsing).
func publicInvokeFlag(f *command.FlagSet) (apply func(ann api.Annotations) api.Annotations) {
	on := f.Bool("public-invoke", false, "let callers without a credential invoke the app's functions and call its triggers (the annotation "+
		api.AnnotationPublicInvoke+"; --public-invoke=false closes it again; off by default)")
	return func(ann api.Annotations) api.Annotations {
		given := false
		f.Visit(func(fl *flag.Flag) { given = given || fl.Name == "public-invoke" })
		if !given {
			return ann
		}
		if ann == nil {
			ann = api.Annotations{}
		}
		ann[api.AnnotationPublicInvoke] = json.RawMessage(`""`) // an update's deletion
		if *on {
			ann[api.AnnotationPublicInvoke] = json.RawMessage(`"true"`)
		}
		return ann
	}
}

// publicInvoke says whether annotations open an app to callers without a
// credential, as the control plane reads them.
func publicInvoke(ann api.Annotations) string {
	if v := strings.TrimSpace(string(ann[api.AnnotationPublicInvoke])); v == `"true"` || v == "true" {
		return "yes"
	}
	return "no"
}

func appCreate(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("NAME [flags]", `
Create an application: a named group of functions whose configuration every
one of them gets. Names are letters, digits, '_' and '-', up to 255.`)
	g := fs.ClientFlags(true)
	cf := defineConfigFlags(fs)
	pub := publicInvokeFlag(fs)
	syslog := fs.String("syslog-url", "", "Fn's syslog `URL` (kept for compatibility; Mercator keeps function output itself)")
	project := fs.String("project", "", "`project` the app and its functions belong to (default: $MERCATOR_PROJECT, the context's, else default)")
	c, name, err := inv.Connect(fs, g, args, "an app name")
	if err != nil {
		return err
	}
	config, secret, ann, err := cf.maps()
	if err != nil {
		return err
	}
	if ann = pub(ann); string(ann[api.AnnotationPublicInvoke]) == `""` {
		delete(ann, api.AnnotationPublicInvoke) // off is the default; a create takes no deletion
	}
	app := api.App{Name: name, Config: config, SecretConfig: secret, Annotations: ann, Project: *project}
	if app.Project == "" {
		app.Project = c.Project
	}
	if *syslog != "" {
		app.SyslogURL = syslog
	}
	created, err := c.CreateApp(ctx, app)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(created)
	}
	termtext.Fprintln(inv.Stdout, created.ID)
	return nil
}

func appList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags]", `List applications by name: of one project with --project (or a project in
the context), else of every project the token may see.`)
	g := fs.ClientFlags(true)
	project := fs.String("project", "", "list only this `project`'s apps (default: $MERCATOR_PROJECT or the context's; every project when neither)")
	c, _, err := inv.Connect(fs, g, args, "")
	if err != nil {
		return err
	}
	apps, err := c.ListApps(ctx)
	if err != nil {
		return err
	}
	if *project == "" {
		*project = c.Project
	}
	if *project != "" {
		apps = slices.DeleteFunc(apps, func(a api.App) bool { return api.ProjectOf(a.Project) != *project })
	}
	if g.JSON() {
		return inv.WriteJSON(api.AppList{Items: append([]api.App{}, apps...)})
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tPROJECT\tCONFIG\tPUBLIC INVOKE\tCREATED")
	for _, a := range apps {
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.Name, a.ID, api.ProjectOf(a.Project), configSummary(a.Config, a.SecretConfig), publicInvoke(a.Annotations), command.FormatTime(&a.CreatedAt))
	}
	return tw.Flush()
}

// configSummary lists configuration keys, secret ones marked.
func configSummary(config, secret map[string]string) string {
	var keys []string
	for k := range config {
		keys = append(keys, k)
	}
	for k := range secret {
		keys = append(keys, k+"(secret)")
	}
	sort.Strings(keys)
	return command.OrDash(strings.Join(keys, ","))
}

func appGet(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("NAME [flags]", `Show an application (secret configuration values are never shown).`)
	g := fs.ClientFlags(true)
	c, name, err := inv.Connect(fs, g, args, "an app name")
	if err != nil {
		return err
	}
	app, err := c.AppByName(ctx, name)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(app)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	termtext.Fprintf(tw, "Name:\t%s\nID:\t%s\nPublic invoke:\t%s\nCreated:\t%s\nUpdated:\t%s\n", app.Name, app.ID, publicInvoke(app.Annotations),
		command.FormatTime(&app.CreatedAt), command.FormatTime(&app.UpdatedAt))
	if app.Shape != "" {
		termtext.Fprintf(tw, "Shape:\t%s\n", app.Shape)
	}
	printConfig(tw, app.Config, app.SecretConfig, app.Annotations)
	return tw.Flush()
}

func printConfig(tw *tabwriter.Writer, config, secret map[string]string, ann api.Annotations) {
	for _, k := range command.SortedKeys(config) {
		termtext.Fprintf(tw, "Config:\t%s=%s\n", k, config[k])
	}
	for _, k := range command.SortedKeys(secret) {
		termtext.Fprintf(tw, "Secret:\t%s=%s\n", k, secret[k])
	}
	for _, k := range command.SortedKeys(ann) {
		termtext.Fprintf(tw, "Annotation:\t%s=%s\n", k, ann[k])
	}
}

func appUpdate(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("NAME [flags]", `
Change an application's configuration, secrets or annotations. Keys given
are set; KEY= removes a key; keys not given are left as they are.
--public-invoke opens the app's functions and triggers to callers without a
credential (the Fn CLI's fn invoke, web hooks); --public-invoke=false closes
them again. Both are recorded in the audit log.`)
	g := fs.ClientFlags(true)
	cf := defineConfigFlags(fs)
	pub := publicInvokeFlag(fs)
	c, name, err := inv.Connect(fs, g, args, "an app name")
	if err != nil {
		return err
	}
	config, secret, ann, err := cf.maps()
	if err != nil {
		return err
	}
	ann = pub(ann)
	app, err := c.AppByName(ctx, name)
	if err != nil {
		return err
	}
	updated, err := c.UpdateApp(ctx, app.ID, api.App{Config: config, SecretConfig: secret, Annotations: ann})
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(updated)
	}
	termtext.Fprintln(inv.Stdout, updated.ID)
	return nil
}

func appDelete(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("NAME [flags]", `Delete an application with its functions and triggers. Durable calls stay readable.`)
	g := fs.ClientFlags(false)
	c, name, err := inv.Connect(fs, g, args, "an app name")
	if err != nil {
		return err
	}
	app, err := c.AppByName(ctx, name)
	if err != nil {
		return err
	}
	if err := c.DeleteApp(ctx, app.ID); err != nil {
		return err
	}
	termtext.Fprintf(inv.Stderr, "app %s deleted\n", name)
	return nil
}
