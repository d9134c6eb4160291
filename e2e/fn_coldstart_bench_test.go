package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/fnagent"
)

// TestFunctionColdStartBench measures a function's cold first call, the
// image already on the node, beside `docker run --rm` of the same image
// (Fn's Go FDK, which exits at once without a listener: the daemon's
// create, start, wait and remove), rounds interleaved in one run:
//
//   - through the control plane: a function created and called at once,
//     its first call's latency at the caller; called once the node
//     reports the container its deploy prepared (created ahead); and
//     called after a scale to zero (its idle timeout passed), on the spare
//     its first call left prepared; both once the spare is the one in a
//     holder's network namespace (fnagent/netns.go), which replaces the
//     spare first prepared within a start's time;
//
//   - the node alone: fnagent.Engine.Call of a function it never ran, in
//     this process, with where the launch took its time (CallReport.Launch).
//
//   - with --min-hot 1 (warm capacity): the first call at once after the
//     create, while the container the deploy asked for starts, and the
//     first call once that container is up.
//
// It prints medians and ratios (target: cold first call ≤ 0.5× docker run)
// and never fails on the figures. Run it with
//
//	MERCATOR_FN_BENCH=1 go test ./e2e -run TestFunctionColdStartBench -v -count=1
//
// MERCATOR_FN_COLD_ROUNDS sets the rounds (default 10).
func TestFunctionColdStartBench(t *testing.T) {
	if os.Getenv("MERCATOR_FN_BENCH") == "" {
		t.Skip("a benchmark: set MERCATOR_FN_BENCH=1 to run it")
	}
	rounds := 10
	if n, err := strconv.Atoi(os.Getenv("MERCATOR_FN_COLD_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	c := startCluster(t)
	c.startAgent("cold")
	image := c.publish("fn-fdk")
	engine, err := fnagent.New(fnagent.Config{NodeID: uniqueNodeID(t, "cold-engine"), SocketRoot: t.TempDir(),
		Tracker: fnagent.NewResourceTracker(fnagent.Capacity{MemoryBytes: 4 << 30, MilliCPUs: 8000})})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close(context.Background())
	app, err := c.client.CreateApp(c.ctx, api.App{Name: "cold"})
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: c.tlsConfig()}}

	call := func(fnID string) time.Duration {
		start := time.Now()
		req, _ := http.NewRequestWithContext(c.ctx, http.MethodPost, c.url+"/invoke/"+fnID, strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("call through the control plane: %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	var netns *netnsStarts // made once the image is on the node
	var ownNetns, sharedNetns []time.Duration
	held := api.Annotations{api.AnnotationMinHot: []byte(`1`)}
	var docker, through, prepared, zero, alone, heldNow, heldReady []time.Duration
	var steps, spareSteps []fnagent.LaunchTimes
	var aloneSpare []time.Duration
	for i := 0; i < rounds; i++ {
		// docker run of the same image.
		start := time.Now()
		if out, err := execOutput("docker", "run", "--rm", image); err != nil && !strings.Contains(out+err.Error(), "exit status") {
			t.Fatalf("docker run: %v: %s", err, out)
		}
		docker = append(docker, time.Since(start))

		// Through the control plane: created, then called at once.
		fn, err := c.client.CreateFn(c.ctx, api.Fn{Name: fmt.Sprintf("cold-%d", i), AppID: app.ID, Image: image, IdleTimeout: 5})
		if err != nil {
			t.Fatal(err)
		}
		through = append(through, call(fn.ID))

		// Created, and called once the node reports the container the
		// deploy's hold prepared (created ahead, not started).
		fn, err = c.client.CreateFn(c.ctx, api.Fn{Name: fmt.Sprintf("prepared-%d", i), AppID: app.ID, Image: image, IdleTimeout: 5})
		if err != nil {
			t.Fatal(err)
		}
		c.waitFor("the prepared container", func() bool {
			hot, err := c.client.FunctionContainers(c.ctx, fn.ID)
			return err == nil && len(hot) == 1 && hot[0].Prepared == 1 && heldSpare(t, fn.ID)
		})
		prepared = append(prepared, call(fn.ID))

		// Called, scaled to zero (its idle timeout passed, no container
		// running), then called again: the image on the node, the spare
		// its first call left prepared there.
		fn, err = c.client.CreateFn(c.ctx, api.Fn{Name: fmt.Sprintf("zero-%d", i), AppID: app.ID, Image: image, IdleTimeout: 1})
		if err != nil {
			t.Fatal(err)
		}
		call(fn.ID)
		c.waitFor("the scale to zero, a spare prepared", func() bool {
			hot, err := c.client.FunctionContainers(c.ctx, fn.ID)
			return err == nil && len(fnContainers(t, fn.ID)) == 0 && len(hot) == 1 && hot[0].Prepared == 1 && hot[0].Idle == 0 && heldSpare(t, fn.ID)
		})
		zero = append(zero, call(fn.ID))

		// With --min-hot 1: called at once (the container the deploy
		// started is on its way), and called once it is up.
		fn, err = c.client.CreateFn(c.ctx, api.Fn{Name: fmt.Sprintf("held-now-%d", i), AppID: app.ID, Image: image, IdleTimeout: 5, Annotations: held})
		if err != nil {
			t.Fatal(err)
		}
		heldNow = append(heldNow, call(fn.ID))
		fn, err = c.client.CreateFn(c.ctx, api.Fn{Name: fmt.Sprintf("held-ready-%d", i), AppID: app.ID, Image: image, IdleTimeout: 5, Annotations: held})
		if err != nil {
			t.Fatal(err)
		}
		c.waitFor("the held container up", func() bool { return len(fnContainers(t, fn.ID)) == 1 && engineIdle(c, fn.ID) })
		heldReady = append(heldReady, call(fn.ID))

		// The node alone, a function it never ran; then, scaled to zero,
		// again on the spare the first call left.
		aloneFn := fnagent.FunctionConfig{ID: fmt.Sprintf("cold-alone-%d", i), Image: image, MemoryMB: 128, IdleTimeout: time.Second}
		engineCall := func(id string) (time.Duration, fnagent.LaunchTimes) {
			start := time.Now()
			report, err := engine.Call(c.ctx, aloneFn, fnagent.CallRequest{ID: id, Body: strings.NewReader(`{}`), ContentLength: 2}, &discardWriter{h: http.Header{}})
			if err != nil || !report.Cold || report.Launch == nil {
				t.Fatalf("cold call on the engine: %v (cold %v)", err, report.Cold)
			}
			return time.Since(start), *report.Launch
		}
		d, l := engineCall(fmt.Sprintf("c%d", i))
		alone, steps = append(alone, d), append(steps, l)
		c.waitFor("the engine's pool scaled to zero, its spare prepared", func() bool {
			for _, s := range engine.Stats() {
				if s.FnID == aloneFn.ID {
					return s.Idle+s.Busy+s.Starting == 0 && s.Prepared == 1 && heldSpare(t, aloneFn.ID)
				}
			}
			return false
		})
		d, l = engineCall(fmt.Sprintf("c%d-spare", i))
		if !l.Prepared {
			t.Fatalf("the engine's call after the scale to zero launched %+v; want its spare", l)
		}
		aloneSpare, spareSteps = append(aloneSpare, d), append(spareSteps, l)

		// The daemon's start with a network namespace of its own, and
		// joining one already made.
		if netns == nil {
			netns = newNetnsStarts(t, image)
		}
		own, shared := netns.round()
		ownNetns, sharedNetns = append(ownNetns, own), append(sharedNetns, shared)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	md, mt, ma := median(docker), median(through), median(alone)
	phases := func(steps []fnagent.LaunchTimes) string {
		step := func(f func(fnagent.LaunchTimes) time.Duration) string {
			var ds []time.Duration
			for _, s := range steps {
				ds = append(ds, f(s))
			}
			return ms(median(ds))
		}
		return fmt.Sprintf("image %s, create+attach %s, start %s, socket %s",
			step(func(l fnagent.LaunchTimes) time.Duration { return l.Image }), step(func(l fnagent.LaunchTimes) time.Duration { return l.Create }),
			step(func(l fnagent.LaunchTimes) time.Duration { return l.Start }), step(func(l fnagent.LaunchTimes) time.Duration { return l.Socket }))
	}
	fmt.Printf("\nCold first call, image on the node, %d rounds interleaved (load average at end: %s)\n", rounds, strings.TrimSpace(string(load)))
	fmt.Printf("%-44s %10s %8s\n", "", "median", "ratio")
	fmt.Printf("%-44s %10s %8s\n", "docker run --rm (same image)", ms(md), "1.00")
	fmt.Printf("%-44s %10s %8.2f\n", "first call after create, through CP", ms(mt), float64(mt)/float64(md))
	fmt.Printf("%-44s %10s %8.2f\n", "first call, prepared container (created ahead)", ms(median(prepared)), float64(median(prepared))/float64(md))
	fmt.Printf("%-44s %10s %8.2f\n", "first call after a scale to zero (spare)", ms(median(zero)), float64(median(zero))/float64(md))
	fmt.Printf("%-44s %10s %8.2f\n", "first call on the node alone (engine)", ms(ma), float64(ma)/float64(md))
	fmt.Printf("%-44s %10s %8.2f\n", "the same, scaled to zero (engine, its spare)", ms(median(aloneSpare)), float64(median(aloneSpare))/float64(md))
	fmt.Printf("%-44s %10s %8.2f\n", "--min-hot 1: first call at once after create", ms(median(heldNow)), float64(median(heldNow))/float64(md))
	fmt.Printf("%-44s %10s %8.2f\n", "--min-hot 1: first call, held container up", ms(median(heldReady)), float64(median(heldReady))/float64(md))
	fmt.Printf("  where the engine's launch went (medians), never ran: %s\n", phases(steps))
	fmt.Printf("  where the engine's launch went (medians), its spare: %s\n", phases(spareSteps))
	var starts []time.Duration
	for _, l := range append(steps, spareSteps...) {
		starts = append(starts, l.Start)
	}
	fmt.Printf("  the daemon's start alone (the floor of a cold start): %s, %.2f× docker run\n", ms(median(starts)), float64(median(starts))/float64(md))
	fmt.Printf("  a start with its own network namespace %s (%.2f× docker run), joining one already made %s (%.2f×)\n",
		ms(median(ownNetns)), float64(median(ownNetns))/float64(md), ms(median(sharedNetns)), float64(median(sharedNetns))/float64(md))
	fmt.Printf("target ≤ 0.5× docker run: after create %v, after create once prepared %v, after a scale to zero %v\n\n",
		float64(mt) <= 0.5*float64(md), float64(median(prepared)) <= 0.5*float64(md), float64(median(zero)) <= 0.5*float64(md))
}

// engineIdle reports whether the node reports an idle container of fnID
// (its facts: the held container is started and waiting).
func engineIdle(c *cluster, fnID string) bool {
	hot, err := c.client.FunctionContainers(c.ctx, fnID)
	for _, h := range hot {
		if h.Idle > 0 {
			return err == nil
		}
	}
	return false
}

// heldSpare reports whether fnID has exactly one container created and not
// started, joining another container's network namespace (a holder's:
// fnagent/netns.go).
func heldSpare(t testing.TB, fnID string) bool {
	created := fnCreated(t, fnID)
	if len(created) != 1 {
		return false
	}
	mode, err := execOutput("docker", "inspect", "--format", "{{.HostConfig.NetworkMode}}", created[0])
	return err == nil && strings.HasPrefix(strings.TrimSpace(mode), "container:")
}
