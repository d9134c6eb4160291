// Package fault is Mercator's fault-injection suite: a real control plane and
// real node agents, each its own `mercator` process, against the real Docker
// daemon, with faults injected while runs are in flight, and then the
// promises of docs/design.md checked against what the daemon itself knows.
//
// The harness builds the mercator binary once per test process (with -race
// when the tests run with -race) and starts `mercator server` and `mercator
// agent` as child processes. Every agent reaches the control plane through a
// faultproxy.Proxy on loopback that the test controls, and a wire tap on that
// proxy parses the node protocol as it passes (requests, event IDs, the
// control plane's acknowledgements, the commands on each session stream),
// which is how the suite knows what was delivered without trusting either
// end's account of it.
//
// The faults, one test each:
//
//   - TestAgentKilledDuringLaunch: kill -9 of the agent at random points of
//     the launch path: a random delay after the launch command went down the
//     session, or a few milliseconds after the daemon's own "create" or
//     "start" event for the container, which lands the kill between the
//     container's creation and the durable MarkApplied. Each kill is
//     classified by where it landed (from the daemon and the dead agent's
//     state file), and SIGSTOP trials are added until a minimum count of
//     kills landed between creation and MarkApplied (too few fails the
//     test). Proves (docs/design.md, promise 1) across a crash: the
//     restarted agent, handed the command again, adopts the container
//     instead of making a second one.
//   - TestRedeliveryStorm: every session stream is cut right after it
//     carries a command while results are held back, so each pending
//     command (launches and stops) is redelivered many times; then the
//     agent is restarted over and over. Proves (docs/design.md, promise 1)
//     against redelivery: one container per attempt, and one result event
//     per operation per agent memory.
//   - TestConnectionFlaps: the agent's connection is cut, blackholed and
//     delayed at random, and once silently frozen (no FIN, no reset), which
//     only the session keep-alive timeout can detect. Proves
//     (docs/design.md, promise 2): what the node observed while
//     disconnected is reported afterwards, with the daemon's moments,
//     exactly once.
//   - TestSilentIdleConnections: the agent's idle keep-alive connections go
//     silent (a NAT forgetting idle mappings) and its session is dropped, so
//     the HTTP client may open the new session on a dead connection (a
//     trial that found no idle connection is tried again; too few counted
//     trials fail the test). Proves the agent bounds the wait for a session
//     to open, not only the silence of an open one.
//   - TestControlPlaneRestart: kill -9 of the control plane at random moments
//     and a restart on the same data directory and port. Proves that nothing
//     acknowledged is forgotten (the store is the only state) and that
//     replayed events are deduplicated by the durable event table.
//   - TestDockerDaemonRestart: a private Docker daemon (its own socket and
//     data root, so the machine's daemon and every other test are
//     untouched) is restarted while containers run; without live-restore
//     they die with it. Proves (docs/design.md, promise 2) for the harshest
//     observation: the ends are reported with the daemon's own moments,
//     never inferred.
//   - TestFencedAgentIsRefused: the node is enrolled again with a new
//     invitation while the old agent process still runs. Proves
//     (docs/design.md, promise 3): the old agent is refused
//     (failure.ErrFenced) and stops, and no report made with the superseded
//     session is accepted, including reports the test forges with it.
//   - TestReplaceAfterUnreachable: the replace_after_seconds policy, written
//     against its documented behaviour (api.RunSpec.ReplaceAfterSeconds):
//     an attempt whose node is unreachable past lease + replace-after is
//     replaced elsewhere, and stopped when its node returns.
//
// The invariants, counted and printed as a table at the end of every test
// (and all tables again at the end of the package):
//
//   - containers per attempt (max), from `docker ps -a` by the
//     mercator.run and mercator.attempt labels: must be ≤ 1
//     (docs/design.md, promise 1).
//   - runs that disagree with the daemon: every run's terminal status, exit
//     code, container ID and start and finish moments compared with
//     `docker inspect` of its containers: must be 0.
//   - daemon facts lost: containers whose exit the daemon knows but the API
//     does not show, plus observations and results still owed in the
//     agent's spool (read from its state file after it stopped) that the
//     control plane never acknowledged, plus events the control plane
//     acknowledged on the wire that its durable event table does not hold:
//     must be 0 (docs/design.md, promise 2).
//   - events applied twice: the control plane's
//     mercator_node_events_total{outcome="applied"} against the rows of its
//     durable event table (one row per first application): every excess
//     application is an event applied twice; plus operations for which one
//     agent memory minted more than one result event (an operation
//     performed twice): must be 0.
//   - stale-token reports accepted: calls made with a superseded session
//     credential, by the old agent or forged by the test, that the control
//     plane answered 2xx (TestFencedAgentIsRefused only): must be 0.
//   - what the wire tap never parsed: every container the daemon has must
//     have had its launch parsed off a session stream and a workload event
//     of its run parsed in an acknowledged batch, so the lost and twice
//     checks cannot pass on a tap that saw nothing: must be 0.
//
// Before judging, every test waits until the agents are quiet (every
// forwarded event acknowledged, the API agreeing with the daemon, and still
// so after one more exchange of each agent) rather than for a fixed time.
//
// Modes: with -short (what CI runs) each fault gets a few trials and the
// package finishes in a few minutes; without -short, or with MERCATOR_LONG=1,
// each gets many more. Every wait is bounded (a hang guard, never a
// performance assertion). A missing Docker daemon fails the suite.
// MERCATOR_FAULT_SEED fixes the random choices; MERCATOR_FAULT_SUMMARY names
// a file the summary tables are appended to; MERCATOR_TEST_LOG=1 prints
// where the processes' logs are kept and keeps them.
package fault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/internal/testimage"
)

// mercatorBin is the binary TestMain built.
var mercatorBin string

// seed is the suite's random seed, printed so a failing run can be repeated.
var seed uint64

func TestMain(m *testing.M) {
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "fault: "+err.Error())
		os.Exit(1)
	}
	code := m.Run()
	printAllSummaries()
	if dir := filepath.Dir(mercatorBin); strings.Contains(dir, "mercator-fault-bin") {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

func setup() error {
	seed = uint64(time.Now().UnixNano())
	if s := os.Getenv("MERCATOR_FAULT_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return fmt.Errorf("MERCATOR_FAULT_SEED=%q: %v", s, err)
		}
		seed = v
	}
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		return fmt.Errorf("no Docker daemon answers (run scripts/ensure-docker.sh): %v: %s", err, out)
	}
	root, err := testimage.Root()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "mercator-fault-bin")
	if err != nil {
		return err
	}
	mercatorBin = filepath.Join(dir, "mercator")
	args := []string{"build", "-o", mercatorBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/mercator")
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// longMode reports whether the many-trials mode is on: without -short, or
// with MERCATOR_LONG set.
func longMode() bool { return os.Getenv("MERCATOR_LONG") != "" || !testing.Short() }

// trials is short in -short mode and long otherwise.
func trials(short, long int) int {
	if longMode() {
		return long
	}
	return short
}

func modeName() string {
	if longMode() {
		return "long"
	}
	return "short"
}

// rng returns the test's random source, derived from the suite's seed and
// the test's name so tests do not perturb each other's choices.
func rng(t *testing.T) *rand.Rand {
	h := uint64(14695981039346656037)
	for _, c := range t.Name() {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return rand.New(rand.NewPCG(seed, h))
}

// uniform returns a duration in [lo, hi).
func uniform(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)))
}

var (
	summariesMu sync.Mutex
	summaries   []string
)

func printAllSummaries() {
	summariesMu.Lock()
	defer summariesMu.Unlock()
	if len(summaries) == 0 {
		return
	}
	out := fmt.Sprintf("\n===== fault-injection summary (%s mode, seed %d) =====\n%s", modeName(), seed, strings.Join(summaries, "\n"))
	fmt.Print(out)
	if path := os.Getenv("MERCATOR_FAULT_SUMMARY"); path != "" {
		if f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
			f.WriteString(out)
			f.Close()
		}
	}
}

// withTimeout is a context bounded by d, for one wait.
func withTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
