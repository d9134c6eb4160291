package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/termtext"
	"github.com/mercator/mercator/pki"
)

// This file holds the commands of trust: the CLI's named contexts (which
// control plane, which credential, which CA) and creating a CA that several
// replicas share.

func init() {
	const summary = "Choose which control plane client commands talk to"
	registerSub("context", summary, &command.Command{Name: "add", Summary: "Save a control plane's address, credential and CA under a name", Run: contextAdd})
	registerSub("context", summary, &command.Command{Name: "use", Summary: "Make a saved context the current one", Run: contextUse})
	registerSub("context", summary, &command.Command{Name: "ls", Summary: "List saved contexts", Run: contextList})
	registerSub("ca", "Manage the CA of a deployment's replicas", &command.Command{Name: "create", Summary: "Create a CA for replicas to share (--tls-ca-cert, --tls-ca-key)", Run: caCreate})
}

func contextPath(inv *command.Invocation) (string, error) {
	p := client.ContextPath(inv.Env)
	if p == "" {
		return "", fmt.Errorf("no place for the context file: set %s, XDG_CONFIG_HOME or HOME", client.EnvConfig)
	}
	return p, nil
}

func contextAdd(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("NAME --addr URL --token-file FILE [--ca-file FILE | --ca-fingerprint SHA256]", `Save a control plane under NAME and make it the current context.

The server is verified with the CA in --ca-file, or with the CA whose
SHA-256 fingerprint --ca-fingerprint gives (as `+"`mercator server`"+` prints
it): the CA is fetched from the server, checked against the fingerprint
and saved beside the context file. With neither, the system's CAs are
trusted (a server with a public certificate).`)
	addr := fs.String("addr", "", "control plane `URL`, e.g. https://cp.example:7070")
	tokenFile := fs.String("token-file", "", "`file` holding the bearer token (the file is named, not copied)")
	caFile := fs.String("ca-file", "", "`file` of the CA certificate the server's chain must lead to")
	fingerprint := fs.String("ca-fingerprint", "", "SHA-256 `fingerprint` of the server's CA: fetch the CA and pin it")
	project := fs.String("project", "", "default `project` of client commands in this context ($MERCATOR_PROJECT beats it)")
	pos, err := fs.Parse(args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) != 1:
		return command.Usagef("want one context NAME")
	case *addr == "" || *tokenFile == "":
		return command.Usagef("--addr and --token-file are required")
	case *caFile != "" && *fingerprint != "":
		return command.Usagef("give --ca-file or --ca-fingerprint, not both")
	}
	path, err := contextPath(inv)
	if err != nil {
		return err
	}
	if *project != "" {
		if err := api.ValidateProjectName("--project", *project); err != nil {
			return err
		}
	}
	c := client.Context{Addr: *addr, TokenFile: absPath(*tokenFile), CAFile: absPath(*caFile), Project: *project}
	if *fingerprint != "" {
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		ca, err := client.FetchCA(fctx, *addr, *fingerprint)
		cancel()
		if err != nil {
			return err
		}
		c.CAFile = filepath.Join(filepath.Dir(path), "ca-"+pos[0]+".pem")
		if err := pki.WriteFileAtomic(c.CAFile, ca, 0o644); err != nil {
			return err
		}
	}
	if c.CAFile != "" {
		if _, err := pki.ReadCertsFile(c.CAFile); err != nil {
			return fmt.Errorf("--ca-file: %w", err)
		}
	}
	if err := client.SaveContext(path, pos[0], c, true); err != nil {
		return err
	}
	termtext.Fprintf(inv.Stderr, "context %s saved in %s and in use\n", pos[0], path)
	return nil
}

func absPath(p string) string {
	if p == "" {
		return ""
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func contextUse(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("NAME", "Make the saved context NAME the current one.")
	pos, err := fs.Parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return command.Usagef("want one context NAME")
	}
	path, err := contextPath(inv)
	if err != nil {
		return err
	}
	return client.UseContext(path, pos[0])
}

func contextList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("", "List the saved contexts; * marks the current one.")
	if pos, err := fs.Parse(args); err != nil {
		return err
	} else if len(pos) > 0 {
		return command.Usagef("unexpected argument %q", pos[0])
	}
	path, err := contextPath(inv)
	if err != nil {
		return err
	}
	cf, _, err := client.ReadContexts(path)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CURRENT\tNAME\tADDR\tCA")
	if len(cf.Contexts) == 0 && cf.Addr != "" {
		termtext.Fprintf(tw, "*\t(default)\t%s\t-\n", cf.Addr)
	}
	for _, n := range cf.Names() {
		c, mark, ca := cf.Contexts[n], "", "(system)"
		if n == cf.Current {
			mark = "*"
		}
		if c.CAFile != "" {
			ca = c.CAFile
			if certs, err := pki.ReadCertsFile(c.CAFile); err == nil {
				ca = "sha256:" + pki.Fingerprint(certs[0])[:16] + "…"
			}
		}
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\n", mark, n, c.Addr, ca)
	}
	return tw.Flush()
}

func caCreate(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("DIR", `Create a CA (ECDSA P-256, valid ten years) in DIR/ca.pem and DIR/ca-key.pem
(mode 0600). Give both files to every replica of one deployment with
--tls-ca-cert and --tls-ca-key, so they all serve certificates from one CA
and every invitation pins it.`)
	pos, err := fs.Parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return command.Usagef("want one DIR")
	}
	certPath, keyPath := filepath.Join(pos[0], "ca.pem"), filepath.Join(pos[0], "ca-key.pem")
	for _, p := range []string{certPath, keyPath} {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%s exists: a CA is made once per deployment", p)
		}
	}
	ca, err := pki.NewCA("Mercator deployment CA", time.Now(), pki.CAValidity)
	if err != nil {
		return err
	}
	if err := ca.Write(certPath, keyPath); err != nil {
		return err
	}
	termtext.Fprintf(inv.Stdout, "%s\n", certPath)
	command.PrintCA(inv, certPath)
	return nil
}
