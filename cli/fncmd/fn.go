package fncmd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/internal/termtext"
)

// `mercator fn …`: functions, through the Fn-compatible API. The verbs
// follow the Fn CLI's where they mean the same (deploy, invoke, list as
// ls, inspect as get, delete); deploy takes an image, since Mercator builds
// nothing, and pins it through the control plane as `run submit` does.

// registerFn adds `mercator fn …` through registerSub (see Register).
func registerFn(registerSub func(group, groupSummary string, c *command.Command)) {
	const group = "Deploy and call functions (Fn-compatible)"
	registerSub("fn", group, &command.Command{Name: "deploy", Summary: "Create or update a function from an image", Run: fnDeploy})
	registerSub("fn", group, &command.Command{Name: "invoke", Summary: "Call a function: stdin in, the response out", Run: fnInvoke})
	registerSub("fn", group, &command.Command{Name: "ls", Summary: "List an app's functions", Run: fnList})
	registerSub("fn", group, &command.Command{Name: "get", Summary: "Show a function", Run: fnGet})
	registerSub("fn", group, &command.Command{Name: "delete", Summary: "Delete a function and its triggers", Run: fnDelete})
	registerSub("fn", group, &command.Command{Name: "call", Summary: "Show a durable call's status (and its result)", Run: fnCall})
	registerSub("fn", group, &command.Command{Name: "logs", Summary: "Print a call's output", Run: fnLogs})
}

// appFn finds APP's function NAME.
func appFn(ctx context.Context, c *client.Client, appName, fnName string) (api.App, api.Fn, error) {
	app, err := c.AppByName(ctx, appName)
	if err != nil {
		return api.App{}, api.Fn{}, err
	}
	fn, err := c.FnByName(ctx, app.ID, fnName)
	return app, fn, err
}

// connectFn parses a command's flags and its APP NAME arguments, connects,
// and finds the function.
func connectFn(ctx context.Context, inv *command.Invocation, fs *command.FlagSet, g *command.ClientFlags, args []string) (*client.Client, api.Fn, error) {
	var appName, name string
	c, err := inv.ConnectWith(fs, g, args, func(pos []string) (err error) {
		appName, name, err = twoArgs(pos)
		return err
	})
	if err != nil {
		return nil, api.Fn{}, err
	}
	_, fn, err := appFn(ctx, c, appName, name)
	return c, fn, err
}

// twoArgs checks for exactly APP and NAME.
func twoArgs(pos []string) (string, string, error) {
	if len(pos) != 2 || strings.TrimSpace(pos[0]) == "" || strings.TrimSpace(pos[1]) == "" {
		return "", "", command.Usagef("want APP and NAME, got %d argument(s)", len(pos))
	}
	return pos[0], pos[1], nil
}

// parseFnMemory reads a memory size for a function: a bare number is MiB,
// Fn's unit; a size with a unit is rounded up to whole MiB.
func parseFnMemory(s string) (uint64, error) {
	if n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64); err == nil {
		return n, nil
	}
	b, err := bytesize.Parse(s)
	if err != nil {
		return 0, err
	}
	return uint64((b + (1<<20 - 1)) >> 20), nil
}

// parseSeconds reads a duration as Fn's whole seconds: "30", "30s", "2m".
// Negative durations and counts past int32 are errors (the server refuses
// out-of-range timeouts with its own message; this one keeps a typo from
// wrapping around into a different number on the way).
func parseSeconds(s string) (int32, error) {
	if n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 32); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("%q is negative; write 0 or more seconds", s)
		}
		return int32(n), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration; write seconds or a duration like 30s or 2m", s)
	}
	if d < 0 || d.Seconds() > math.MaxInt32 {
		return 0, fmt.Errorf("%q is outside 0 to %d seconds", s, math.MaxInt32)
	}
	return int32(math.Ceil(d.Seconds())), nil
}

func fnDeploy(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("--app APP NAME --image REF [flags]", `
Deploy a function: create APP's function NAME from the image, or, when it
exists, update it. The image is pinned to its digest by the control plane
(as run submit pins a run's), every time it is deployed, so redeploying a
tag that moved takes the new image; a pinned function never changes under
its callers. Flags not given keep a function's current settings.

--memory is in MiB when it has no unit (Fn's convention); --timeout and
--idle-timeout take seconds or a duration (30, 30s, 2m). --trigger adds an
HTTP trigger, named like the function, at /t/APP/SOURCE.

Warm capacity: --min-hot N keeps N containers started across the fleet with
no calls (on the first nodes of the function's order; 0 lets it scale to
zero), --max-hot M caps them across the fleet, and the function's image is
pulled on its first nodes at every deploy. --scale-down is how long an idle
container beyond the minimum is kept: Fn's idle timeout, under the name
the policy gives it. --target-concurrency N: a node starts another container
only when the function's calls there, in flight and waiting, exceed N per
container (each still serves one call at a time, as on Fn; default 1).

Prints the function's ID on stdout.`)
	g := fs.ClientFlags(true)
	appName := fs.String("app", "", "the function's `app` (required)")
	createApp := fs.Bool("create-app", false, "create the app if it does not exist")
	image := fs.String("image", "", "image `REF`, with a tag or a digest (required for a new function)")
	memory := fs.String("memory", "", "memory `size` of each container: MiB, or a size like 256MiB (default 128)")
	timeout := fs.String("timeout", "", "`duration` a call may take (default 30s, at most 300s)")
	idle := fs.String("idle-timeout", "", "`duration` an idle container is kept (default 30s, at most 3600s)")
	cpu := fs.Float64("cpu", 0, "CPU `cores` each container gets and reserves, e.g. 0.5 (0: no quota)")
	gpus := fs.Int("gpus", 0, "whole GPUs each container gets")
	gpuModel := fs.String("gpu-model", "", "GPU `model` the function needs, matched as a case-insensitive substring")
	maxConc := fs.Int("max-concurrency", 0, "most containers, and so concurrent calls, per node (0: no cap)")
	trigger := fs.String("trigger", "", "add an HTTP trigger with this `source` path, e.g. /hello")
	minHot := fs.Int("min-hot", -1, "`containers` kept started across the fleet with no calls (0 to 100; the annotation "+api.AnnotationMinHot+")")
	maxHot := fs.Int("max-hot", -1, "most `containers` across the fleet (0: no cap; the annotation "+api.AnnotationMaxHot+")")
	target := fs.Int("target-concurrency", -1, "`calls` in flight and waiting per container before a node starts another (1 to 100, default 1; the annotation "+api.AnnotationTargetConcurrency+")")
	scaleDown := fs.String("scale-down", "", "`duration` an idle container beyond --min-hot is kept before it goes (the idle timeout)")
	cf := defineConfigFlags(fs)
	pos, err := fs.Parse(args)
	if err != nil {
		return err
	}
	name, err := command.OneArg(pos, "function name")
	if err != nil {
		return err
	}
	if err := g.Check(); err != nil {
		return err
	}
	if *appName == "" {
		return command.Usagef("--app is required")
	}
	patch := api.Fn{Name: name, Image: strings.TrimSpace(*image), CPU: *cpu, GPUs: *gpus, GPUModel: *gpuModel, MaxConcurrency: *maxConc}
	if *memory != "" {
		if patch.Memory, err = parseFnMemory(*memory); err != nil {
			return command.Usagef("--memory: %v", err)
		}
	}
	if *timeout != "" {
		if patch.Timeout, err = parseSeconds(*timeout); err != nil {
			return command.Usagef("--timeout: %v", err)
		}
	}
	if patch.IdleTimeout, err = idleTimeoutFlag(*idle, *scaleDown); err != nil {
		return err
	}
	if *trigger != "" && !strings.HasPrefix(*trigger, "/") {
		*trigger = "/" + *trigger
	}
	if patch.Config, patch.SecretConfig, patch.Annotations, err = cf.maps(); err != nil {
		return err
	}
	patch.Annotations = withCounts(patch.Annotations, map[string]int{api.AnnotationMinHot: *minHot, api.AnnotationMaxHot: *maxHot, api.AnnotationTargetConcurrency: *target})
	c, err := inv.Client(g)
	if err != nil {
		return err
	}
	app, err := c.AppByName(ctx, *appName)
	if errors.Is(err, failure.ErrNotFound) && *createApp {
		app, err = c.CreateApp(ctx, api.App{Name: *appName})
	}
	if err != nil {
		return err
	}
	fn, err := createOrUpdateFn(ctx, inv, c, app, patch)
	if err != nil {
		return err
	}
	if *trigger != "" {
		if err := ensureTrigger(ctx, inv, c, app, fn, *trigger); err != nil {
			return err
		}
	}
	if g.JSON() {
		return inv.WriteJSON(fn)
	}
	termtext.Fprintln(inv.Stdout, fn.ID)
	return nil
}

// withCounts is withCount of each key.
func withCounts(ann api.Annotations, counts map[string]int) api.Annotations {
	for key, n := range counts {
		ann = withCount(ann, key, n)
	}
	return ann
}

// withCount sets annotation key to n in ann when the flag was given (n is
// not -1; the control plane checks the range).
func withCount(ann api.Annotations, key string, n int) api.Annotations {
	if n == -1 {
		return ann
	}
	if ann == nil {
		ann = api.Annotations{}
	}
	ann[key] = json.RawMessage(strconv.Itoa(n))
	return ann
}

// idleTimeoutFlag is --idle-timeout, or --scale-down, its name in the
// warm-capacity policy, in seconds; 0 when neither was given.
func idleTimeoutFlag(idle, scaleDown string) (int32, error) {
	if idle != "" && scaleDown != "" {
		return 0, command.Usagef("--scale-down is the idle timeout: give --scale-down or --idle-timeout, not both")
	}
	if v := cmp.Or(idle, scaleDown); v != "" {
		n, err := parseSeconds(v)
		if err != nil {
			return 0, command.Usagef("--idle-timeout/--scale-down: %v", err)
		}
		return n, nil
	}
	return 0, nil
}

// createOrUpdateFn creates app's function patch.Name from patch, or, when
// it exists, updates it with the fields patch sets, and says which on
// stderr.
func createOrUpdateFn(ctx context.Context, inv *command.Invocation, c *client.Client, app api.App, patch api.Fn) (api.Fn, error) {
	name := patch.Name
	existing, err := c.FnByName(ctx, app.ID, name)
	switch {
	case errors.Is(err, failure.ErrNotFound):
		if patch.Image == "" {
			return api.Fn{}, command.Usagef("--image is required for a new function")
		}
		patch.AppID = app.ID
		fn, err := c.CreateFn(ctx, patch)
		if err != nil {
			return api.Fn{}, err
		}
		termtext.Fprintf(inv.Stderr, "created function %s in app %s, image %s\n", name, app.Name, fn.PinnedImage)
		return fn, nil
	case err != nil:
		return api.Fn{}, err
	}
	patch.Name = ""
	fn, err := c.UpdateFn(ctx, existing.ID, patch)
	if err != nil {
		return api.Fn{}, err
	}
	termtext.Fprintf(inv.Stderr, "updated function %s in app %s, image %s\n", name, app.Name, fn.PinnedImage)
	return fn, nil
}

// ensureTrigger gives fn an HTTP trigger at source, named like it.
func ensureTrigger(ctx context.Context, inv *command.Invocation, c *client.Client, app api.App, fn api.Fn, source string) error {
	triggers, err := c.ListTriggers(ctx, app.ID, fn.ID)
	if err != nil {
		return err
	}
	for _, t := range triggers {
		if t.Source == source {
			termtext.Fprintf(inv.Stderr, "trigger at %s\n", endpointOf(t.Annotations, api.AnnotationTriggerEndpoint))
			return nil
		}
	}
	t, err := c.CreateTrigger(ctx, api.Trigger{Name: fn.Name, AppID: app.ID, FnID: fn.ID, Type: "http", Source: source})
	if err != nil {
		return err
	}
	termtext.Fprintf(inv.Stderr, "trigger at %s\n", endpointOf(t.Annotations, api.AnnotationTriggerEndpoint))
	return nil
}

func endpointOf(ann api.Annotations, key string) string {
	var s string
	if raw, ok := ann[key]; ok {
		s = strings.Trim(string(raw), `"`)
	}
	return command.OrDash(s)
}

func fnInvoke(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("APP NAME [flags]", `
Call APP's function NAME: standard input is streamed to it as the request
body (nothing when it is a terminal) and its response body is streamed to
standard output as it arrives. The call goes through the control plane to
a node, like any caller's. A function that answers 4xx or 5xx exits 1 after
printing its body; --detached stores the call and prints its ID instead
(see fn call and fn logs); --call-id prints a synchronous call's ID to
standard error, for fn logs. The response reaches a terminal escaped unless
--raw is given, as with run logs.`)
	g := fs.ClientFlags(false)
	contentType := fs.String("content-type", "", "the request's Content-Type, e.g. application/json")
	detached := fs.Bool("detached", false, "store the call and return its ID at once (Fn-Invoke-Type: detached)")
	showID := fs.Bool("call-id", false, "print the call's ID to standard error once it ends (read its output with fn logs)")
	raw := command.RawFlag(fs)
	var headers command.StringList
	fs.Var(&headers, "header", "add a request header `'NAME: VALUE'` (repeatable)")
	fs.AliasShort("H", "header")
	pos, err := fs.Parse(args)
	if err != nil {
		return err
	}
	appName, name, err := twoArgs(pos)
	if err != nil {
		return err
	}
	h := http.Header{}
	for _, kv := range headers {
		k, v, ok := strings.Cut(kv, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return command.Usagef("--header %q: want 'NAME: VALUE'", kv)
		}
		h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	if *contentType != "" {
		h.Set("Content-Type", *contentType)
	}
	c, err := inv.Client(g)
	if err != nil {
		return err
	}
	_, fn, err := appFn(ctx, c, appName, name)
	if err != nil {
		return err
	}
	var body io.Reader = inv.Stdin
	if f, ok := inv.Stdin.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			body = http.NoBody
		}
	}
	if body == nil {
		body = http.NoBody
	}
	if *detached {
		id, err := c.InvokeDetached(ctx, fn.ID, body, h)
		if err != nil {
			return err
		}
		termtext.Fprintln(inv.Stdout, id)
		return nil
	}
	out, finish := termtext.Output(inv.Stdout, *raw)
	res, err := c.Invoke(ctx, fn.ID, body, h, out)
	err = finish(err)
	if *showID && res.CallID != "" {
		termtext.Fprintf(inv.Stderr, "call %s\n", res.CallID)
	}
	if err != nil {
		return err
	}
	if res.Status >= 400 {
		termtext.Fprintf(inv.Stderr, "error: the function answered %d %s (call %s)\n", res.Status, http.StatusText(res.Status), res.CallID)
		return command.ExitCode(1)
	}
	return nil
}

func fnList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("APP [flags]", `List an app's functions by name.`)
	g := fs.ClientFlags(true)
	c, appName, err := inv.Connect(fs, g, args, "app name")
	if err != nil {
		return err
	}
	app, err := c.AppByName(ctx, appName)
	if err != nil {
		return err
	}
	fns, err := c.ListFns(ctx, app.ID)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(api.FnList{Items: append([]api.Fn{}, fns...)})
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tIMAGE\tMEMORY\tTIMEOUT\tCPU\tGPUS")
	for _, f := range fns {
		cpu, gpus := "-", "-"
		if f.CPU > 0 {
			cpu = strconv.FormatFloat(f.CPU, 'g', -1, 64)
		}
		if f.GPUs > 0 {
			gpus = strconv.Itoa(f.GPUs) + " " + f.GPUModel
		}
		termtext.Fprintf(tw, "%s\t%s\t%s\t%dMiB\t%ds\t%s\t%s\n", f.Name, f.ID, f.Image, f.Memory, f.Timeout, cpu, strings.TrimSpace(gpus))
	}
	return tw.Flush()
}

func fnGet(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("APP NAME [flags]", `Show a function: its pinned image, resources, configuration (secret values are never shown) and invoke endpoint.`)
	g := fs.ClientFlags(true)
	c, fn, err := connectFn(ctx, inv, fs, g, args)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(fn)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	termtext.Fprintf(tw, "Name:\t%s\nID:\t%s\nApp:\t%s\nImage:\t%s\nPinned:\t%s\n", fn.Name, fn.ID, fn.AppID, fn.Image, fn.PinnedImage)
	termtext.Fprintf(tw, "Memory:\t%d MiB\nTimeout:\t%ds\nIdle timeout:\t%ds\n", fn.Memory, fn.Timeout, fn.IdleTimeout)
	if fn.CPU > 0 {
		termtext.Fprintf(tw, "CPU:\t%g\n", fn.CPU)
	}
	if fn.GPUs > 0 {
		termtext.Fprintf(tw, "GPUs:\t%d %s\n", fn.GPUs, fn.GPUModel)
	}
	if fn.MaxConcurrency > 0 {
		termtext.Fprintf(tw, "Max concurrency:\t%d per node\n", fn.MaxConcurrency)
	}
	termtext.Fprintf(tw, "Invoke:\t%s\n", endpointOf(fn.Annotations, api.AnnotationInvokeEndpoint))
	ann := api.Annotations{}
	for k, v := range fn.Annotations {
		if k != api.AnnotationInvokeEndpoint {
			ann[k] = v
		}
	}
	printConfig(tw, fn.Config, fn.SecretConfig, ann)
	printHot(ctx, tw, c, fn.ID)
	printImageHolders(ctx, tw, c, fn.Image)
	return tw.Flush()
}

// printImageHolders prints the nodes that hold the function's image, as
// they last reported (client.NodesHoldingImage): where its deploy
// prefetched it or a call pulled it.
func printImageHolders(ctx context.Context, tw *tabwriter.Writer, c *client.Client, image string) {
	nodes, err := c.NodesHoldingImage(ctx, image)
	switch {
	case err != nil:
		termtext.Fprintf(tw, "Image held on:\t(cannot list nodes: %v)\n", err)
	case len(nodes) == 0:
		termtext.Fprintf(tw, "Image held on:\tno node (as the nodes last reported)\n")
	default:
		termtext.Fprintf(tw, "Image held on:\t%s\n", strings.Join(nodes, ", "))
	}
}

// printHot prints the function's containers on each node, as the nodes
// last reported them (client.FunctionContainers).
func printHot(ctx context.Context, tw *tabwriter.Writer, c *client.Client, fnID string) {
	hot, err := c.FunctionContainers(ctx, fnID)
	if err != nil {
		termtext.Fprintf(tw, "Hot containers:\t(cannot list nodes: %v)\n", err)
	} else if len(hot) == 0 {
		termtext.Fprintf(tw, "Hot containers:\tnone (as the nodes last reported)\n")
	}
	for _, h := range hot {
		termtext.Fprintf(tw, "Hot on %s:\t%d idle, %d busy, %d starting, %d prepared\n", h.NodeID, h.Idle, h.Busy, h.Starting, h.Prepared)
	}
}

func fnDelete(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("APP NAME [flags]", `Delete a function and its triggers. Its durable calls stay readable.`)
	g := fs.ClientFlags(false)
	c, fn, err := connectFn(ctx, inv, fs, g, args)
	if err != nil {
		return err
	}
	if err := c.DeleteFn(ctx, fn.ID); err != nil {
		return err
	}
	termtext.Fprintf(inv.Stderr, "function %s deleted\n", fn.Name)
	return nil
}

func fnCall(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("APP NAME CALL_ID [flags]", `
Show a durable (detached) call: its status, deliveries, node and outcome.
--wait waits until it has ended; --result prints the function's response
body instead.`)
	g := fs.ClientFlags(true)
	wait := fs.Bool("wait", false, "wait until the call has ended")
	result := fs.Bool("result", false, "print the function's response body")
	var pos []string
	c, err := inv.ConnectWith(fs, g, args, func(p []string) error { pos = p; return callArgs(p) })
	if err != nil {
		return err
	}
	_, fn, err := appFn(ctx, c, pos[0], pos[1])
	if err != nil {
		return err
	}
	call, err := c.GetCall(ctx, fn.ID, pos[2])
	for err == nil && *wait && (call.Status == api.CallQueued || call.Status == api.CallRunning) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		call, err = c.GetCall(ctx, fn.ID, pos[2])
	}
	if err != nil {
		return err
	}
	if *result {
		_, err := c.CallResult(ctx, fn.ID, call.ID, inv.Stdout)
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(call)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	termtext.Fprintf(tw, "ID:\t%s\nStatus:\t%s\nDeliveries:\t%d\nNode:\t%s\n", call.ID, call.Status, call.Attempts, command.OrDash(call.NodeID))
	if call.ResponseStatus != 0 {
		termtext.Fprintf(tw, "Response:\t%d\n", call.ResponseStatus)
	}
	if call.Error != "" {
		termtext.Fprintf(tw, "Error:\t%s (%s)\n", call.Error, call.ErrorKind)
	}
	termtext.Fprintf(tw, "Created:\t%s\nStarted:\t%s\nCompleted:\t%s\n", command.FormatTime(&call.CreatedAt), command.FormatTime(call.StartedAt), command.FormatTime(call.CompletedAt))
	return tw.Flush()
}

// callArgs checks the positional arguments of the commands that name one
// call: APP NAME CALL_ID.
func callArgs(pos []string) error {
	if len(pos) != 3 {
		return command.Usagef("want APP, NAME and CALL_ID, got %d argument(s)", len(pos))
	}
	return nil
}

func fnLogs(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("APP NAME CALL_ID [flags]", `
Print what the function wrote to stdout and stderr during a call. A durable
call's output is stored with it; a synchronous call's is asked of the nodes
that keep it, which keep only their most recent calls' (fn invoke --call-id
prints a synchronous call's ID). It reaches a terminal escaped unless --raw
is given, as with run logs.`)
	g := fs.ClientFlags(false)
	raw := command.RawFlag(fs)
	var pos []string
	c, err := inv.ConnectWith(fs, g, args, func(p []string) error { pos = p; return callArgs(p) })
	if err != nil {
		return err
	}
	_, fn, err := appFn(ctx, c, pos[0], pos[1])
	if err != nil {
		return err
	}
	log, err := c.CallLog(ctx, fn.ID, pos[2])
	if err != nil {
		return err
	}
	w, finish := termtext.Output(inv.Stdout, *raw)
	_, err = io.WriteString(w, log)
	return finish(err)
}
