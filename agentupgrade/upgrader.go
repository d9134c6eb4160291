// Package agentupgrade is the agent's side of a self-upgrade: it carries
// out the upgrade_agent command (fetch the release through the read the
// control plane minted, check it with package agentrelease, probe it, put
// it in place of the running binary keeping the old one as BINARY.prev,
// and re-exec with the same arguments), and it rolls back on its own when
// the new binary does not come back.
//
// The supervisor is the agent itself, in two steps around the exec
// (docs/upgrades.md says why not the service manager alone):
//
//   - Before: the staged binary must answer `version -o json` with the
//     release's version within probeTimeout, so a binary that cannot start
//     at all is refused while the old agent still runs and nothing was
//     replaced.
//   - After: the record the old binary wrote (upgrade.json in the state
//     directory) is read by whichever binary starts next (Start). The new
//     one arms a timer; it confirms when the control plane's redelivered
//     command reaches it (proof that it is connected and speaking), and
//     otherwise restores BINARY.prev and execs it. A binary crashing at
//     start under a service manager is rolled back on its fourth start;
//     one that dies before it counts is counted by the previous binary,
//     run after each failed end by the unit's ExecStopPost (Recover).
//
// The state file is never touched: the new process resumes the session,
// adopts the running containers and replays the spool, as after any
// restart.
//
// Only the composition root (package daemon) imports agentupgrade.
package agentupgrade

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/mercator/mercator/agentrelease"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// DefaultDeadline is how long a new binary has to come back connected
// when the command states none.
const DefaultDeadline = 2 * time.Minute

// probeTimeout bounds the staged binary's `version -o json`.
const probeTimeout = 10 * time.Second

// Config configures an Upgrader.
type Config struct {
	// StateDir is the agent's state directory (the record lives there).
	StateDir string
	// Binary is the running binary's path (os.Executable), replaced in
	// place; Args its arguments (os.Args), given again to the exec.
	Binary string
	Args   []string
	// Version is this build's agent version.
	Version string
	// Client fetches the minted read; nil is http.DefaultClient.
	Client *http.Client
	Logger *slog.Logger
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Exec replaces the process; nil is syscall.Exec. It returns only on
	// failure.
	Exec func(path string, args, env []string) error
	// Quiesce, when set, is called just before the exec, once every check
	// passed and the new binary is in place: what the process must finish
	// before it is replaced. The daemon drains the function engine there
	// (calls in flight finish, new ones are refused as busy, its
	// containers are removed), so no call is cut off mid-answer.
	Quiesce func()
}

// Upgrader carries out upgrade_agent commands. Safe for concurrent use.
type Upgrader struct {
	cfg Config

	mu        sync.Mutex // one upgrade at a time; guards trial
	trial     *Record    // the record of the upgrade this binary is on trial for
	confirmed chan struct{}
}

// New returns an Upgrader; call Start before the agent runs.
func New(cfg Config) *Upgrader {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Exec == nil {
		cfg.Exec = syscall.Exec
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Client == nil {
		cfg.Client = http.DefaultClient
	}
	return &Upgrader{cfg: cfg, confirmed: make(chan struct{})}
}

// Start reads the pending record and acts on it (Decide): a binary on
// trial is watched until ctx ends, a rollback is carried out now (Start
// then returns only if the exec failed). The state directory must exist.
func (u *Upgrader) Start(ctx context.Context) error {
	rec, err := readRecord(u.cfg.StateDir)
	if err != nil {
		return err
	}
	d, next, reason := Decide(rec, u.cfg.Version, u.cfg.Now())
	if next != nil && next != rec {
		if err := writeRecord(u.cfg.StateDir, next); err != nil {
			return err
		}
	}
	switch d {
	case RollBack:
		return u.rollBack(next, reason)
	case Failed:
		u.cfg.Logger.Warn("upgrade failed", "to", next.To, "reason", reason)
	case Watch:
		u.mu.Lock()
		u.trial = next
		u.mu.Unlock()
		u.cfg.Logger.Info("new agent binary on trial", "version", next.To, "deadline", next.Deadline, "start", next.Starts)
		go u.watch(ctx, next)
	}
	return nil
}

// watch rolls back unless the trial is confirmed by its deadline.
func (u *Upgrader) watch(ctx context.Context, rec *Record) {
	t := time.NewTimer(rec.Deadline.Sub(u.cfg.Now()))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-u.confirmed:
	case <-t.C:
		u.mu.Lock()
		defer u.mu.Unlock()
		if u.trial == nil {
			return
		}
		r := *rec
		if err := u.rollBack(&r, fmt.Sprintf("version %s did not come back connected within its deadline (%s)", rec.To, rec.Deadline.Format(time.RFC3339))); err != nil {
			u.cfg.Logger.Error("roll back", "err", err)
		}
	}
}

// rollBack restores the previous binary, records why, and execs it.
func (u *Upgrader) rollBack(rec *Record, reason string) error {
	u.cfg.Logger.Error("rolling back the agent upgrade", "to", rec.From, "reason", reason)
	if err := restore(rec); err != nil {
		return err
	}
	rec.Failed = reason
	if err := writeRecord(u.cfg.StateDir, rec); err != nil {
		return err
	}
	return u.cfg.Exec(rec.Binary, u.cfg.Args, os.Environ())
}

// restore puts the previous binary back in place.
func restore(rec *Record) error {
	if err := os.Rename(rec.Prev, rec.Binary); err != nil {
		return fmt.Errorf("roll back: restore %s: %w", rec.Prev, err)
	}
	return nil
}

// Upgrade carries out one upgrade_agent command, operation opID. It
// returns nil when this binary already runs c.Version (confirming a
// trial), the recorded failure when this binary was restored after that
// very operation, and otherwise does not return unless the release was
// refused or could not be put in place (the error says why; nothing was
// replaced then).
func (u *Upgrader) Upgrade(ctx context.Context, opID string, c nodeproto.UpgradeAgentCommand) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	rec, err := readRecord(u.cfg.StateDir)
	if err != nil {
		return err
	}
	if rec != nil && rec.OperationID == opID && rec.Failed != "" {
		if err := removeRecord(u.cfg.StateDir); err != nil {
			return err
		}
		return failure.Invalid("upgrade", "rolled back to %s: %s", rec.From, rec.Failed)
	}
	if c.Version == u.cfg.Version {
		if rec != nil && rec.To == c.Version && rec.Failed == "" {
			if err := removeRecord(u.cfg.StateDir); err != nil {
				return err
			}
			if u.trial != nil {
				u.trial = nil
				close(u.confirmed)
			}
			u.cfg.Logger.Info("agent upgrade confirmed", "version", c.Version)
		}
		return nil
	}
	if p := runtime.GOOS + "/" + runtime.GOARCH; c.Platform != p {
		return failure.Invalid("platform", "the release is for %s and this node is %s", c.Platform, p)
	}
	if c.URL == "" {
		return failure.Invalid("url", "the command carries no read of the release (the control plane could not mint one; its log says why)")
	}
	staged, err := u.fetch(ctx, c)
	if err != nil {
		return err
	}
	defer os.Remove(staged) // a no-op once it was renamed into place
	if err := probe(ctx, staged, c.Version); err != nil {
		return err
	}
	return u.replace(opID, staged, c)
}

// fetch downloads and checks the release, and writes it next to the
// binary (same file system, so the rename into place is atomic), mode
// 0755. It returns the staged path.
func (u *Upgrader) fetch(ctx context.Context, c nodeproto.UpgradeAgentCommand) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL, nil)
	if err != nil {
		return "", failure.Invalid("url", "the release's read %q: %v", c.URL, err)
	}
	resp, err := u.cfg.Client.Do(req)
	if err != nil {
		return "", fmt.Errorf("fetch the release: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fmt.Errorf("fetch the release: %s: %s", resp.Status, msg)
	}
	b, err := agentrelease.Read(resp.Body, agentrelease.Expect{SHA256: c.SHA256, Size: c.Size, Signature: c.Signature, Key: keyOf(c.PublicKey)})
	if err != nil {
		return "", err
	}
	staged := filepath.Join(filepath.Dir(u.cfg.Binary), "."+filepath.Base(u.cfg.Binary)+".staged")
	if err := writeFileSync(staged, b, 0o755); err != nil {
		return "", fmt.Errorf("stage the release: %w", err)
	}
	return staged, nil
}

func keyOf(b []byte) ed25519.PublicKey {
	if len(b) == 0 {
		return nil
	}
	return ed25519.PublicKey(b)
}

// probe requires the staged binary to state want as its agent version.
func probe(ctx context.Context, path, want string) error {
	got, _, err := Probe(ctx, path)
	if err != nil {
		return failure.Invalid("release", "the new binary does not start: %v", err)
	}
	if got != want {
		return failure.Invalid("release", "the new binary says it is agent version %q, not %q", got, want)
	}
	return nil
}

// Probe runs the mercator binary at path as `version -o json`, for at most
// probeTimeout, and returns the agent version and platform it states.
func Probe(ctx context.Context, path string) (version, platform string, err error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "version", "-o", "json").Output()
	if err != nil {
		return "", "", fmt.Errorf("`%s version -o json` failed: %v", path, err)
	}
	var v struct {
		AgentVersion string `json:"agent_version"`
		Platform     string `json:"platform"`
	}
	if err := json.Unmarshal(out, &v); err != nil || v.AgentVersion == "" {
		return "", "", fmt.Errorf("%s does not state an agent version", path)
	}
	return v.AgentVersion, v.Platform, nil
}

// replace puts staged in place of the binary, keeping the binary as
// BINARY.prev, records the pending upgrade and execs. It returns only when
// the exec failed, after undoing the swap.
func (u *Upgrader) replace(opID, staged string, c nodeproto.UpgradeAgentCommand) error {
	bin := u.cfg.Binary
	prev := bin + ".prev"
	deadline := c.Deadline
	if deadline <= 0 {
		deadline = DefaultDeadline
	}
	rec := &Record{OperationID: opID, From: u.cfg.Version, To: c.Version, Binary: bin, Prev: prev, Deadline: u.cfg.Now().Add(deadline)}
	if err := os.Link(bin, prev+".tmp"); err != nil {
		if err := copyFile(bin, prev+".tmp"); err != nil {
			return fmt.Errorf("keep the previous binary: %w", err)
		}
	}
	if err := os.Rename(prev+".tmp", prev); err != nil {
		return fmt.Errorf("keep the previous binary: %w", err)
	}
	if err := writeRecord(u.cfg.StateDir, rec); err != nil {
		return err
	}
	if err := os.Rename(staged, bin); err != nil {
		removeRecord(u.cfg.StateDir)
		return fmt.Errorf("put the new binary in place: %w", err)
	}
	if err := syncDir(filepath.Dir(bin)); err != nil {
		u.cfg.Logger.Warn("sync the binary's directory", "err", err)
	}
	if u.cfg.Quiesce != nil {
		u.cfg.Quiesce()
	}
	u.cfg.Logger.Info("re-executing as the new agent", "from", rec.From, "to", rec.To, "binary", bin)
	err := u.cfg.Exec(bin, u.cfg.Args, os.Environ())
	// Only a failed exec gets here: undo.
	os.Rename(prev, bin)
	removeRecord(u.cfg.StateDir)
	return fmt.Errorf("exec the new binary: %w", err)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
