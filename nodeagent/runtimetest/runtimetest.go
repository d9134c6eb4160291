// Package runtimetest is the conformance suite every nodeagent.Runtime
// implementation runs, fakes included, so a fake the agent's tests lean on
// cannot drift from the real thing (containerd's core/snapshots/testsuite
// is the model). Imported only by tests: nodeagent/dockerruntime's, and any
// future runtime's.
package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/nodeproto"
)

// Harness is what the Runtime conformance suite needs of one
// implementation.
type Harness struct {
	// Runtime is the implementation under test. It must see only the
	// workloads launched through it in this test (a fresh node label, a
	// fresh fake), so Observe's answers can be checked exactly, and it
	// must clean up what it launched when the test ends.
	Runtime nodeagent.Runtime
	// Image is a pinned reference (repo@sha256:…) to the test workload
	// image (testdata/images/workload) that Runtime can prepare, so the
	// command ["exit", "3"] exits 3 and ["sleep", "60"] sleeps until
	// SIGTERM.
	Image string
}

// Run checks the behaviour every Runtime promises the
// agent, whatever runs the containers. Each subtest asks newHarness for a
// fresh runtime. Run it against every implementation, fakes included, so a
// fake the agent's tests lean on cannot drift from the real thing.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	for _, c := range []struct {
		name string
		test func(t *testing.T, h Harness)
	}{
		{"PrepareImageRefusesUnpinned", prepareImageRefusesUnpinned},
		{"PrepareImageIsIdempotent", prepareImageIsIdempotent},
		{"LaunchRefusesUnpinned", launchRefusesUnpinned},
		{"LaunchRefusesContainmentNoNodeGrants", launchRefusesContainmentNoNodeGrants},
		{"LaunchWithContainmentRuns", launchWithContainmentRuns},
		{"LaunchReportsExitWithDaemonMoments", launchReportsExitWithDaemonMoments},
		{"RedeliveredLaunchStartsNothing", redeliveredLaunchStartsNothing},
		{"StopOfUnknownWorkloadSucceeds", stopOfUnknownWorkloadSucceeds},
		{"StopEndsWithinGrace", stopEndsWithinGrace},
		{"StopKillsAfterGrace", stopKillsAfterGrace},
		{"EnvironmentAndLogs", environmentAndLogs},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.test(t, newHarness(t))
		})
	}
}

// unpinned is references to h's image that a node refuses: by tag, by a
// tag beside the digest, by a malformed digest, and none at all.
func unpinned(h Harness) []string {
	repo, digest, _ := strings.Cut(h.Image, "@")
	return []string{repo, repo + ":latest", repo + ":latest@" + digest, repo + "@sha256:1234", ""}
}

func prepareImageRefusesUnpinned(t *testing.T, h Harness) {
	for _, ref := range unpinned(h) {
		err := h.Runtime.PrepareImage(context.Background(), nodeproto.PrepareImageCommand{Image: ref})
		if !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("PrepareImage(%q) = %v, want an error matching failure.ErrInvalid", ref, err)
		}
	}
}

// launchRefusesUnpinned: a launch is refused as its image's prepare is,
// and leaves nothing behind for Observe to report.
func launchRefusesUnpinned(t *testing.T, h Harness) {
	for i, ref := range unpinned(h) {
		key := nodeproto.WorkloadKey{RunID: RunID(t), Attempt: i + 1}
		err := h.Runtime.LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: ref, Command: []string{"exit", "0"}})
		if !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("LaunchWorkload with image %q = %v, want an error matching failure.ErrInvalid", ref, err)
		}
	}
	observations, err := h.Runtime.Observe(context.Background())
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	if len(observations) != 0 {
		t.Errorf("Observe after refused launches = %+v, want nothing", observations)
	}
}

// launchRefusesContainmentNoNodeGrants: the host's network, another
// container's, a user that reads as an option, a negative process limit
// are refused as invalid, and leave nothing behind for Observe to report.
func launchRefusesContainmentNoNodeGrants(t *testing.T, h Harness) {
	for i, change := range []func(*nodeproto.LaunchWorkloadCommand){
		func(c *nodeproto.LaunchWorkloadCommand) { c.Network = "host" },
		func(c *nodeproto.LaunchWorkloadCommand) { c.Network = "container:other" },
		func(c *nodeproto.LaunchWorkloadCommand) { c.User = "--privileged" },
		func(c *nodeproto.LaunchWorkloadCommand) { c.PidsLimit = -1 },
	} {
		launch := nodeproto.LaunchWorkloadCommand{WorkloadKey: nodeproto.WorkloadKey{RunID: RunID(t), Attempt: i + 1}, Image: h.Image, Command: []string{"exit", "0"}}
		change(&launch)
		if err := h.Runtime.LaunchWorkload(context.Background(), launch); !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("LaunchWorkload(network %q, user %q, pids %d) = %v, want an error matching failure.ErrInvalid",
				launch.Network, launch.User, launch.PidsLimit, err)
		}
	}
	observations, err := h.Runtime.Observe(context.Background())
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	if len(observations) != 0 {
		t.Errorf("Observe after refused launches = %+v, want nothing", observations)
	}
}

// launchWithContainmentRuns: what a Run may ask (a numeric user, a
// read-only root filesystem, no network, a process limit) still runs the
// test workload, a static program in an image FROM scratch, to its exit.
func launchWithContainmentRuns(t *testing.T, h Harness) {
	key := nodeproto.WorkloadKey{RunID: RunID(t), Attempt: 1}
	launch := nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: h.Image, Command: []string{"exit", "4"},
		User: "65534:65534", ReadOnlyRootfs: true, Network: nodeproto.NetworkNone, PidsLimit: 64}
	if err := h.Runtime.LaunchWorkload(context.Background(), launch); err != nil {
		t.Fatalf("LaunchWorkload: %v", err)
	}
	if o := WaitForPhase(t, h.Runtime, key, nodeproto.PhaseExited); o.ExitCode == nil || *o.ExitCode != 4 {
		t.Errorf("ExitCode = %v, want 4", derefInt(o.ExitCode))
	}
}

func prepareImageIsIdempotent(t *testing.T, h Harness) {
	for i := 0; i < 2; i++ {
		if err := h.Runtime.PrepareImage(context.Background(), nodeproto.PrepareImageCommand{Image: h.Image}); err != nil {
			t.Fatalf("PrepareImage #%d: %v", i+1, err)
		}
	}
}

func launchReportsExitWithDaemonMoments(t *testing.T, h Harness) {
	key := nodeproto.WorkloadKey{RunID: RunID(t), Attempt: 1}
	launch := nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: h.Image, Command: []string{"exit", "3"}, Timeout: time.Hour}
	if err := h.Runtime.LaunchWorkload(context.Background(), launch); err != nil {
		t.Fatalf("LaunchWorkload: %v", err)
	}
	o := WaitForPhase(t, h.Runtime, key, nodeproto.PhaseExited)
	if o.ExitCode == nil || *o.ExitCode != 3 {
		t.Errorf("ExitCode = %v, want 3", derefInt(o.ExitCode))
	}
	if o.StartedAt == nil || o.FinishedAt == nil {
		t.Fatalf("StartedAt = %v, FinishedAt = %v; want both stated", o.StartedAt, o.FinishedAt)
	}
	if o.FinishedAt.Before(*o.StartedAt) {
		t.Errorf("FinishedAt %v is before StartedAt %v", o.FinishedAt, o.StartedAt)
	}
	if o.ContainerID == "" || o.Image != h.Image || o.Timeout != time.Hour || o.OOMKilled {
		t.Errorf("observation = %+v; want a container ID, image %s, timeout 1h, not OOM-killed", o, h.Image)
	}
}

func redeliveredLaunchStartsNothing(t *testing.T, h Harness) {
	running := nodeproto.WorkloadKey{RunID: RunID(t), Attempt: 1}
	exited := nodeproto.WorkloadKey{RunID: running.RunID, Attempt: 2}
	sleep := nodeproto.LaunchWorkloadCommand{WorkloadKey: running, Image: h.Image, Command: []string{"sleep", "60"}}
	echo := nodeproto.LaunchWorkloadCommand{WorkloadKey: exited, Image: h.Image, Command: []string{"echo", "once"}}
	for _, launch := range []nodeproto.LaunchWorkloadCommand{sleep, echo} {
		if err := h.Runtime.LaunchWorkload(context.Background(), launch); err != nil {
			t.Fatalf("LaunchWorkload(%v): %v", launch.WorkloadKey, err)
		}
	}
	first := WaitForPhase(t, h.Runtime, running, nodeproto.PhaseRunning)
	done := WaitForPhase(t, h.Runtime, exited, nodeproto.PhaseExited)

	for _, launch := range []nodeproto.LaunchWorkloadCommand{sleep, echo} {
		if err := h.Runtime.LaunchWorkload(context.Background(), launch); err != nil {
			t.Fatalf("redelivered LaunchWorkload(%v) = %v, want success", launch.WorkloadKey, err)
		}
	}
	observations, err := h.Runtime.Observe(context.Background())
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	if len(observations) != 2 {
		t.Fatalf("Observe = %+v, want exactly the two launched attempts", observations)
	}
	for _, o := range observations {
		switch o.WorkloadKey {
		case running:
			if o.ContainerID != first.ContainerID || o.Phase != nodeproto.PhaseRunning || !o.StartedAt.Equal(*first.StartedAt) {
				t.Errorf("after redelivery %v = %+v, want the first container still running", running, o)
			}
		case exited:
			if o.ContainerID != done.ContainerID || !o.Same(done) {
				t.Errorf("after redelivery %v = %+v, want %+v unchanged (an exited attempt is never started again)", exited, o, done)
			}
		default:
			t.Errorf("unexpected observation %+v", o)
		}
	}
}

func stopOfUnknownWorkloadSucceeds(t *testing.T, h Harness) {
	stop := nodeproto.StopWorkloadCommand{WorkloadKey: nodeproto.WorkloadKey{RunID: RunID(t), Attempt: 7}}
	for i := 0; i < 2; i++ {
		if err := h.Runtime.StopWorkload(context.Background(), stop); err != nil {
			t.Fatalf("StopWorkload #%d of a workload never launched = %v, want nil", i+1, err)
		}
	}
}

func stopEndsWithinGrace(t *testing.T, h Harness) {
	key := nodeproto.WorkloadKey{RunID: RunID(t), Attempt: 1}
	if err := h.Runtime.LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: h.Image, Command: []string{"sleep", "120"}}); err != nil {
		t.Fatalf("LaunchWorkload: %v", err)
	}
	WaitForPhase(t, h.Runtime, key, nodeproto.PhaseRunning)
	const grace = 20 * time.Second
	began := time.Now()
	if err := h.Runtime.StopWorkload(context.Background(), nodeproto.StopWorkloadCommand{WorkloadKey: key, Reason: "cancelled", GracePeriod: grace}); err != nil {
		t.Fatalf("StopWorkload: %v", err)
	}
	if took := time.Since(began); took >= grace {
		t.Errorf("StopWorkload of a workload that exits on SIGTERM took %v, want well inside the %v grace", took, grace)
	}
	o := WaitForPhase(t, h.Runtime, key, nodeproto.PhaseExited)
	if o.ExitCode == nil || *o.ExitCode != 0 {
		t.Errorf("ExitCode = %v, want 0 (the workload exits cleanly on SIGTERM)", derefInt(o.ExitCode))
	}
	if err := h.Runtime.StopWorkload(context.Background(), nodeproto.StopWorkloadCommand{WorkloadKey: key}); err != nil {
		t.Errorf("second StopWorkload = %v, want nil", err)
	}
}

func stopKillsAfterGrace(t *testing.T, h Harness) {
	key := nodeproto.WorkloadKey{RunID: RunID(t), Attempt: 1}
	if err := h.Runtime.LaunchWorkload(context.Background(), nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: h.Image, Command: []string{"ignore-term", "120"}}); err != nil {
		t.Fatalf("LaunchWorkload: %v", err)
	}
	WaitForPhase(t, h.Runtime, key, nodeproto.PhaseRunning)
	began := time.Now()
	if err := h.Runtime.StopWorkload(context.Background(), nodeproto.StopWorkloadCommand{WorkloadKey: key, GracePeriod: time.Second}); err != nil {
		t.Fatalf("StopWorkload: %v", err)
	}
	if took := time.Since(began); took < time.Second || took > 30*time.Second {
		t.Errorf("StopWorkload of a workload ignoring SIGTERM took %v, want the 1s grace and then a kill", took)
	}
	o := WaitForPhase(t, h.Runtime, key, nodeproto.PhaseExited)
	if o.ExitCode == nil || *o.ExitCode != 137 {
		t.Errorf("ExitCode = %v, want 137 (SIGKILL)", derefInt(o.ExitCode))
	}
}

func environmentAndLogs(t *testing.T, h Harness) {
	logs, ok := h.Runtime.(nodeagent.LogSource)
	if !ok {
		t.Skip("this runtime is not a LogSource")
	}
	key := nodeproto.WorkloadKey{RunID: RunID(t), Attempt: 1}
	launch := nodeproto.LaunchWorkloadCommand{WorkloadKey: key, Image: h.Image, Command: []string{"env", "GREETING"}, Env: map[string]string{"GREETING": "hello from env"}}
	if err := h.Runtime.LaunchWorkload(context.Background(), launch); err != nil {
		t.Fatalf("LaunchWorkload: %v", err)
	}
	WaitForPhase(t, h.Runtime, key, nodeproto.PhaseExited)
	if got := ReadLogs(t, logs, key, true); got != "hello from env\n" {
		t.Errorf("Logs = %q, want %q", got, "hello from env\n")
	}
	_, err := logs.Logs(context.Background(), nodeproto.WorkloadKey{RunID: RunID(t), Attempt: 9}, false)
	if !errors.Is(err, failure.ErrNotFound) {
		t.Errorf("Logs of a workload never launched = %v, want failure.ErrNotFound", err)
	}
}

// WaitForPhase polls Observe until key is in phase, failing the test after
// a minute (a generous bound for a daemon under a parallel test load).
func WaitForPhase(t *testing.T, rt nodeagent.Runtime, key nodeproto.WorkloadKey, phase string) nodeproto.WorkloadObservation {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last []nodeproto.WorkloadObservation
	for time.Now().Before(deadline) {
		observations, err := rt.Observe(context.Background())
		if err != nil {
			t.Fatalf("Observe: %v", err)
		}
		last = observations
		for _, o := range observations {
			if o.WorkloadKey == key && o.Phase == phase {
				return o
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%v did not reach phase %q; last observations %+v", key, phase, last)
	return nodeproto.WorkloadObservation{}
}

// ReadLogs reads a workload's whole combined output.
func ReadLogs(t *testing.T, logs nodeagent.LogSource, key nodeproto.WorkloadKey, follow bool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc, err := logs.Logs(ctx, key, follow)
	if err != nil {
		t.Fatalf("Logs(%v): %v", key, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading Logs(%v): %v", key, err)
	}
	return string(data)
}

// RunID is a run ID no other test, in this process or another, uses:
// the test's name (slashes and all, which exercises a runtime's
// sanitising of container names) and random hex.
func RunID(t *testing.T) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return t.Name() + "-" + hex.EncodeToString(b[:])
}

func derefInt(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}
