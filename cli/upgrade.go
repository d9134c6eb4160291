package cli

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mercator/mercator/agentrelease"
	"github.com/mercator/mercator/agentupgrade"
	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/internal/termtext"
)

// This file holds `mercator agent-release …` and `mercator node upgrade`:
// agent binaries stored by the control plane and rolled out to nodes
// (docs/upgrades.md). `mercator agent install` is agentinstall.go.

const releaseSummary = "Store agent binaries the control plane rolls out to nodes"

func init() {
	registerSub("agent-release", releaseSummary, &command.Command{Name: "push", Summary: "Store an agent binary as a release", Run: releasePush})
	registerSub("agent-release", releaseSummary, &command.Command{Name: "ls", Summary: "List agent releases", Run: releaseList})
	registerSub("agent-release", releaseSummary, &command.Command{Name: "rm", Summary: "Remove an agent release", Run: releaseRemove})
	registerSub("agent-release", releaseSummary, &command.Command{Name: "rollout", Summary: "Show the latest rollout, or one by ID", Run: rolloutShow})
	registerSub("node", nodeSummary, &command.Command{Name: "upgrade", Summary: "Upgrade nodes' agents to a release, canaries first", Run: nodeUpgrade})
}

func releasePush(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] PATH", `
Store the mercator binary at PATH as an agent release. Its SHA-256 and size
are recorded; nodes fetch it through a read the control plane mints, and
check both (and the signature) before running it. Without --version, the
binary is run as `+"`PATH version -o json`"+` to read its agent version and platform.
A server started with --release-key refuses a release whose --signature
(an Ed25519 signature of the file's bytes, raw or base64) does not verify.`)
	g := fs.ClientFlags(true)
	version := fs.String("version", "", "the release's agent `version` (default: what the binary says)")
	platform := fs.String("platform", "", "`os/arch` the binary is built for: linux/amd64 or linux/arm64 (default: what the binary says)")
	sigFile := fs.String("signature", "", "`file` of the Ed25519 signature of the binary's bytes")
	var path string
	c, err := inv.ConnectWith(fs, g, args, func(pos []string) (err error) {
		path, err = command.OneArg(pos, "PATH")
		return err
	})
	if err != nil {
		return err
	}
	if *version == "" || *platform == "" {
		v, p, err := agentupgrade.Probe(ctx, path)
		if err != nil {
			return fmt.Errorf("cannot read the release's version: %w; give --version and --platform", err)
		}
		*version, *platform = cmp.Or(*version, v), cmp.Or(*platform, p)
	}
	if err := agentrelease.CheckVersion(*version); err != nil {
		return err
	}
	if err := agentrelease.CheckPlatform(*platform); err != nil {
		return err
	}
	var sig []byte
	if *sigFile != "" {
		b, err := os.ReadFile(*sigFile)
		if err != nil {
			return err
		}
		if sig, err = agentrelease.ParseSignature(b); err != nil {
			return fmt.Errorf("--signature %s: %w", *sigFile, err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	rel, err := c.PushAgentRelease(ctx, *version, *platform, f, st.Size(), sig)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(rel)
	}
	_, err = termtext.Fprintf(inv.Stdout, "stored agent release %s %s (%s, sha256 %s, signed: %t)\n", rel.Version, rel.Platform, bytesize.Format(rel.Size), rel.SHA256, rel.Signed)
	return err
}

func releaseList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags]", `List the agent releases the control plane stores, by version.`)
	g := fs.ClientFlags(true)
	c, _, err := inv.Connect(fs, g, args, "")
	if err != nil {
		return err
	}
	list, err := c.ListAgentReleases(ctx)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(list)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tPLATFORM\tSIZE\tSIGNED\tSHA256\tCREATED")
	for _, r := range list.Releases {
		created := r.CreatedAt
		termtext.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\n", r.Version, r.Platform, bytesize.Format(r.Size), r.Signed, r.SHA256[:min(12, len(r.SHA256))], command.FormatTime(&created))
	}
	return tw.Flush()
}

func releaseRemove(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] VERSION", `Remove an agent release. A release a running rollout uses is refused.`)
	g := fs.ClientFlags(false)
	platform := fs.String("platform", "linux/amd64", "the release's `os/arch`")
	c, version, err := inv.Connect(fs, g, args, "VERSION")
	if err != nil {
		return err
	}
	if err := c.RemoveAgentRelease(ctx, version, *platform); err != nil {
		return err
	}
	termtext.Fprintf(inv.Stderr, "removed agent release %s %s\n", version, *platform)
	return nil
}

func nodeUpgrade(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NODE_ID... | --all", `
Upgrade the agents of the nodes named (or of every ready node) to an agent
release: the first --canary nodes alone, then the rest --max-parallel at a
time once the canaries came back connected reporting the new version; the
first failure (a refused release, a rollback) stops the rollout. Running
containers keep running: each agent re-executes itself and adopts them.
--status shows the latest rollout instead (see docs/upgrades.md).`)
	g := fs.ClientFlags(true)
	all := fs.Bool("all", false, "every ready node")
	to := fs.String("to", "", "release `version` (default: the newest pushed)")
	platform := fs.String("platform", "linux/amd64", "the release's `os/arch`")
	parallel := fs.Int("max-parallel", 1, "nodes upgrading at once after the canaries")
	canary := fs.Int("canary", 1, "nodes upgraded first, alone")
	deadline := fs.Duration("deadline", 2*time.Minute, "how long each new agent has to come back before it rolls back")
	status := fs.Bool("status", false, "show the latest rollout and upgrade nothing")
	var nodes []string
	c, err := inv.ConnectWith(fs, g, args, func(pos []string) error {
		nodes = pos
		switch {
		case *status && (len(pos) > 0 || *all):
			return command.Usagef("--status takes no nodes")
		case !*status && *all == (len(pos) > 0):
			return command.Usagef("name the nodes to upgrade, or --all")
		case *parallel < 1 || *canary < 0 || *deadline < time.Second:
			return command.Usagef("--max-parallel must be at least 1, --canary at least 0, --deadline at least 1s")
		}
		return nil
	})
	if err != nil {
		return err
	}
	if *status {
		return showRollout(ctx, inv, g, c, "")
	}
	ro, err := c.StartRollout(ctx, api.RolloutRequest{Nodes: nodes, All: *all, Version: *to, Platform: *platform,
		MaxParallel: *parallel, Canary: canary, DeadlineSeconds: int(deadline.Seconds())})
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(ro)
	}
	_, err = termtext.Fprintf(inv.Stdout, "rollout %s: %d nodes to %s, canary %d, max parallel %d\nfollow it with: mercator node upgrade --status\n",
		ro.ID, len(ro.Nodes), ro.Version, ro.Canary, ro.MaxParallel)
	return err
}

func rolloutShow(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] [ROLLOUT_ID]", `Show the latest rollout, or the one named: its state, and each node's.`)
	g := fs.ClientFlags(true)
	var id string
	c, err := inv.ConnectWith(fs, g, args, func(pos []string) error {
		if len(pos) > 1 {
			return command.Usagef("unexpected argument %q", pos[1])
		}
		if len(pos) == 1 {
			id = pos[0]
		}
		return nil
	})
	if err != nil {
		return err
	}
	return showRollout(ctx, inv, g, c, id)
}

func showRollout(ctx context.Context, inv *command.Invocation, g *command.ClientFlags, c *client.Client, id string) error {
	var ro api.Rollout
	if id != "" {
		var err error
		if ro, err = c.GetRollout(ctx, id); err != nil {
			return err
		}
	} else {
		list, err := c.ListRollouts(ctx)
		if err != nil {
			return err
		}
		if len(list.Rollouts) == 0 {
			return fmt.Errorf("no rollout yet: start one with `mercator node upgrade`")
		}
		ro = list.Rollouts[0]
	}
	if g.JSON() {
		return inv.WriteJSON(ro)
	}
	counts := map[string]int{}
	for _, n := range ro.Nodes {
		counts[n.State]++
	}
	var parts []string
	for _, s := range []string{"upgraded", "sent", "pending", "failed"} {
		parts = append(parts, s+" "+strconv.Itoa(counts[s]))
	}
	termtext.Fprintf(inv.Stdout, "rollout %s to %s (%s): %s; %s\n", ro.ID, ro.Version, ro.Platform, ro.State, strings.Join(parts, ", "))
	if ro.Reason != "" {
		termtext.Fprintf(inv.Stdout, "stopped: %s\n", ro.Reason)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tSENT\tERROR")
	for _, n := range ro.Nodes {
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.ID, n.State, command.FormatTime(n.SentAt), n.Error)
	}
	return tw.Flush()
}
