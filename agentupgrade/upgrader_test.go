package agentupgrade

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// script is a stand-in binary: it answers `version -o json` with version
// (or exits 3 at once when version is ""), as the probe asks.
func script(version string) []byte {
	if version == "" {
		return []byte("#!/bin/sh\nexit 3\n")
	}
	return []byte("#!/bin/sh\necho '{\"agent_version\":\"" + version + "\"}'\n")
}

type harness struct {
	t       *testing.T
	dir     string
	bin     string
	srv     *httptest.Server
	body    []byte
	execs   []string // binary contents at each exec
	records []*Record
	// quiesced counts Quiesce's calls, and atExec how many there had
	// been at each exec.
	quiesced int
	atExec   []int
}

var errExec = errors.New("exec stubbed")

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, dir: t.TempDir()}
	h.bin = filepath.Join(t.TempDir(), "mercator")
	if err := os.WriteFile(h.bin, script("v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(h.body) }))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *harness) upgrader(version string, now time.Time) *Upgrader {
	return New(Config{StateDir: h.dir, Binary: h.bin, Args: []string{"mercator", "agent"}, Version: version, Client: h.srv.Client(),
		Now:     func() time.Time { return now },
		Quiesce: func() { h.quiesced++ },
		Exec: func(path string, args, env []string) error {
			b, _ := os.ReadFile(path)
			h.execs = append(h.execs, string(b))
			h.atExec = append(h.atExec, h.quiesced)
			rec, _ := readRecord(h.dir)
			h.records = append(h.records, rec)
			return errExec
		}})
}

func (h *harness) command(body []byte, version string) nodeproto.UpgradeAgentCommand {
	h.body = body
	sum := sha256.Sum256(body)
	return nodeproto.UpgradeAgentCommand{Version: version, Platform: runtime.GOOS + "/" + runtime.GOARCH, SHA256: hex.EncodeToString(sum[:]),
		Size: int64(len(body)), URL: h.srv.URL + "/release", Deadline: time.Minute}
}

func (h *harness) binary() string {
	b, err := os.ReadFile(h.bin)
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

// TestUpgradeExecsVerifiedRelease: a good release is put in place, the old
// binary kept as .prev, the record written, and the process exec'd; a
// failed exec undoes all three.
func TestUpgradeExecsVerifiedRelease(t *testing.T) {
	h := newHarness(t)
	cmd := h.command(script("v2"), "v2")
	err := h.upgrader("v1", t0).Upgrade(context.Background(), "op-1", cmd)
	if !errors.Is(err, errExec) || len(h.execs) != 1 {
		t.Fatalf("Upgrade: %v, %d execs", err, len(h.execs))
	}
	if h.execs[0] != string(script("v2")) {
		t.Errorf("exec'd %q, want the new binary", h.execs[0])
	}
	if h.atExec[0] != 1 {
		t.Errorf("the process was quiesced %d times before its exec, want once (the function engine drained)", h.atExec[0])
	}
	if r := h.records[0]; r == nil || r.OperationID != "op-1" || r.From != "v1" || r.To != "v2" || !r.Deadline.Equal(t0.Add(time.Minute)) {
		t.Errorf("record at exec: %+v", h.records[0])
	}
	// The exec failed (stubbed): the old binary is back and no record left.
	if h.binary() != string(script("v1")) {
		t.Errorf("after a failed exec the binary is %q", h.binary())
	}
	if rec, _ := readRecord(h.dir); rec != nil {
		t.Errorf("record left after a failed exec: %+v", rec)
	}
}

// TestUpgradeRefusesBadReleases: a wrong hash, a missing or wrong
// signature, a binary that cannot start, another platform: refused with
// the reason, nothing replaced, nothing exec'd.
func TestUpgradeRefusesBadReleases(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	for name, c := range map[string]struct {
		mutate func(h *harness) nodeproto.UpgradeAgentCommand
		msg    string
	}{
		"wrong hash": {func(h *harness) nodeproto.UpgradeAgentCommand {
			c := h.command(script("v2"), "v2")
			h.body = script("v3")
			return c
		}, "hashes to"},
		"unsigned": {func(h *harness) nodeproto.UpgradeAgentCommand {
			c := h.command(script("v2"), "v2")
			c.PublicKey = pub
			return c
		}, "no signature"},
		"wrongly signed": {func(h *harness) nodeproto.UpgradeAgentCommand {
			c := h.command(script("v2"), "v2")
			c.PublicKey, c.Signature = pub, ed25519.Sign(other, script("v2"))
			return c
		}, "does not verify"},
		"exits at start": {func(h *harness) nodeproto.UpgradeAgentCommand { return h.command(script(""), "v2") }, "does not start"},
		"says another version": {func(h *harness) nodeproto.UpgradeAgentCommand {
			return h.command(script("v9"), "v2")
		}, `"v9", not "v2"`},
		"other platform": {func(h *harness) nodeproto.UpgradeAgentCommand {
			c := h.command(script("v2"), "v2")
			c.Platform = "linux/s390x"
			return c
		}, "is for linux/s390x"},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			err := h.upgrader("v1", t0).Upgrade(context.Background(), "op-1", c.mutate(h))
			if err == nil || errors.Is(err, errExec) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("got %v, want a refusal saying %q", err, c.msg)
			}
			if len(h.execs) != 0 || h.binary() != string(script("v1")) || h.quiesced != 0 {
				t.Fatalf("refused release still replaced the binary, exec'd (%d) or quiesced the process (%d)", len(h.execs), h.quiesced)
			}
		})
	}
	// Signed right: accepted (it reaches the exec).
	h := newHarness(t)
	c := h.command(script("v2"), "v2")
	c.PublicKey, c.Signature = pub, ed25519.Sign(priv, script("v2"))
	if err := h.upgrader("v1", t0).Upgrade(context.Background(), "op-1", c); !errors.Is(err, errExec) {
		t.Fatalf("a rightly signed release: %v", err)
	}
}

// pending puts the state as the old binary leaves it just before the exec:
// the new binary in place, the old one as .prev, the record written.
func (h *harness) pending(deadline time.Time) {
	if err := os.WriteFile(h.bin+".prev", script("v1"), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(h.bin, script("v2"), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := writeRecord(h.dir, &Record{OperationID: "op-1", From: "v1", To: "v2", Binary: h.bin, Prev: h.bin + ".prev", Deadline: deadline}); err != nil {
		h.t.Fatal(err)
	}
}

// TestConfirmedByTheRedeliveredCommand: the new binary starts on trial and
// the command delivered again confirms it: ok, record gone.
func TestConfirmedByTheRedeliveredCommand(t *testing.T) {
	h := newHarness(t)
	h.pending(t0.Add(time.Minute))
	u := h.upgrader("v2", t0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := u.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := u.Upgrade(ctx, "op-1", h.command(script("v2"), "v2")); err != nil {
		t.Fatalf("redelivered command on the new binary: %v", err)
	}
	if rec, _ := readRecord(h.dir); rec != nil || len(h.execs) != 0 {
		t.Fatalf("after confirmation: record %+v, %d execs", rec, len(h.execs))
	}
	select {
	case <-u.confirmed:
	default:
		t.Fatal("the trial's watch was not released")
	}
}

// TestRollBackAtStartAndReport: a new binary starting past its deadline
// restores .prev and execs it; the restored binary answers the command
// with the failure, once.
func TestRollBackAtStartAndReport(t *testing.T) {
	h := newHarness(t)
	h.pending(t0)
	err := h.upgrader("v2", t0.Add(time.Second)).Start(context.Background())
	if !errors.Is(err, errExec) || len(h.execs) != 1 || h.execs[0] != string(script("v1")) {
		t.Fatalf("Start: %v, execs %q", err, h.execs)
	}
	if r := h.records[0]; r == nil || !strings.Contains(r.Failed, "did not come back connected") {
		t.Fatalf("record at the rollback's exec: %+v", r)
	}
	old := h.upgrader("v1", t0.Add(2*time.Second))
	if err := old.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	err = old.Upgrade(context.Background(), "op-1", h.command(script("v2"), "v2"))
	if err == nil || !strings.Contains(err.Error(), "rolled back to v1") {
		t.Fatalf("restored agent answers %v", err)
	}
	if rec, _ := readRecord(h.dir); rec != nil {
		t.Fatalf("record kept after the failure was reported: %+v", rec)
	}
}

// TestDecide: the start decision as a table.
func TestDecide(t *testing.T) {
	rec := &Record{To: "v2", From: "v1", Deadline: t0.Add(time.Minute)}
	crashed := *rec
	crashed.Starts = maxStarts
	failed := *rec
	failed.Failed = "x"
	for name, c := range map[string]struct {
		rec  *Record
		self string
		now  time.Time
		want Decision
	}{
		"none":             {nil, "v1", t0, Nothing},
		"trial":            {rec, "v2", t0, Watch},
		"past deadline":    {rec, "v2", t0.Add(time.Minute), RollBack},
		"crash loop":       {&crashed, "v2", t0, RollBack},
		"never ran":        {rec, "v1", t0, Failed},
		"already reported": {&failed, "v1", t0, Nothing},
	} {
		if got, _, _ := Decide(c.rec, c.self, c.now); got != c.want {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
}

// TestRecoverAfterFailedEnds: the service manager's half. A clean stop
// counts nothing; each failed end of the binary on trial counts a start;
// past maxStarts the previous binary is put back and the failure recorded
// for the restored agent to report.
func TestRecoverAfterFailedEnds(t *testing.T) {
	h := newHarness(t)
	h.pending(t0.Add(time.Hour))
	if restored, err := Recover(h.dir, false); restored || err != nil {
		t.Fatalf("clean stop: %v %v", restored, err)
	}
	for i := 1; i <= maxStarts; i++ {
		if restored, err := Recover(h.dir, true); restored || err != nil {
			t.Fatalf("failed end %d: %v %v", i, restored, err)
		}
	}
	if h.binary() != string(script("v2")) {
		t.Fatal("restored before the count was reached")
	}
	restored, err := Recover(h.dir, true)
	if !restored || err != nil || h.binary() != string(script("v1")) {
		t.Fatalf("past the count: %v %v, binary %q", restored, err, h.binary())
	}
	old := h.upgrader("v1", t0)
	if err := old.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := old.Upgrade(context.Background(), "op-1", h.command(script("v2"), "v2")); err == nil || !strings.Contains(err.Error(), "ended in failure 4 times") {
		t.Fatalf("restored agent answers %v", err)
	}
	if restored, err := Recover(h.dir, true); restored || err != nil {
		t.Fatalf("nothing on trial any more: %v %v", restored, err)
	}
}
