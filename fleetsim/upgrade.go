package fleetsim

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"time"

	"github.com/mercator/mercator/agentrelease"
	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/nodeproto"
)

// A fleet upgrade in the simulation (Config.UpgradeAt, docs/upgrades.md):
// an agent release is pushed to the control plane and a rollout of every
// node started (`node upgrade --all --max-parallel N`). Each simulated
// agent carries out its upgrade_agent command as a real one does up to the
// exec: it fetches the release through the read the control plane minted
// and checks its size and SHA-256 (agentrelease.Read). Then, where a real
// agent would exec the new binary, the simulated one is replaced by a new
// agent on the same state reporting the new version, which resumes the
// session, is redelivered the command and confirms it, as the real new
// binary does. The report gives the rollout's time to finish and its
// outcome beside the fleet's missed leases.

// simVersion is the simulated agents' version before an upgrade, and
// upgradeVersion the release's.
const (
	simVersion     = "fleetsim"
	upgradeVersion = "fleetsim-2"
)

// releaseSize is the simulated release's size: enough to be a real fetch,
// small enough that a fleet's worth is not the measurement.
const releaseSize = 64 << 10

// UpgradeReport is how the rollout went.
type UpgradeReport struct {
	Nodes       int     `json:"nodes"`
	MaxParallel int     `json:"max_parallel"`
	State       string  `json:"state"`
	Reason      string  `json:"reason,omitempty"`
	Upgraded    int     `json:"upgraded"`
	Failed      int     `json:"failed"`
	FinishedS   float64 `json:"finished_s"` // from the rollout's start to its end (or to the hold's end)
	LeaseLapses int64   `json:"lease_lapses"`
}

func (u *UpgradeReport) String() string {
	return fmt.Sprintf("rollout of %s to %d nodes, %d at a time: %s after %.1fs (%d upgraded, %d failed)%s; %d lease lapses since it began",
		upgradeVersion, u.Nodes, u.MaxParallel, u.State, u.FinishedS, u.Upgraded, u.Failed, reasonOf(u.Reason), u.LeaseLapses)
}

func reasonOf(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

// upgradeState follows a rollout during the hold.
type upgradeState struct {
	id      string
	start   time.Time
	lapses0 int64
	report  UpgradeReport
	done    bool
}

// startUpgrade pushes the release and starts the rollout of every node.
func (s *sim) startUpgrade(ctx context.Context, c *client.Client) (*upgradeState, error) {
	bin := make([]byte, releaseSize)
	rand.Read(bin)
	platform := runtime.GOOS + "/" + runtime.GOARCH
	if _, err := c.PushAgentRelease(ctx, upgradeVersion, platform, bytes.NewReader(bin), int64(len(bin)), nil); err != nil {
		return nil, fmt.Errorf("push the simulated release: %w", err)
	}
	canary := 1
	ro, err := c.StartRollout(ctx, api.RolloutRequest{All: true, Version: upgradeVersion, Platform: platform,
		MaxParallel: s.cfg.UpgradeParallel, Canary: &canary, DeadlineSeconds: 120})
	if err != nil {
		return nil, fmt.Errorf("start the rollout: %w", err)
	}
	u := &upgradeState{id: ro.ID, start: time.Now(), lapses0: int64(s.sum(lapsesMetric))}
	u.report = UpgradeReport{Nodes: len(ro.Nodes), MaxParallel: ro.MaxParallel, State: ro.State}
	return u, nil
}

// lapsesMetric is the control plane's count of lease lapses.
const lapsesMetric = "mercator_node_lease_lapses_total"

// follow reads the rollout once, and notes its end; lapses is the control
// plane's lapse count now.
func (u *upgradeState) follow(ctx context.Context, c *client.Client, lapses int64) {
	if u.done {
		return
	}
	ro, err := c.GetRollout(ctx, u.id)
	if err != nil {
		return
	}
	u.report.State, u.report.Reason, u.report.Upgraded, u.report.Failed = ro.State, ro.Reason, 0, 0
	for _, n := range ro.Nodes {
		switch n.State {
		case "upgraded":
			u.report.Upgraded++
		case "failed":
			u.report.Failed++
		}
	}
	u.report.FinishedS = time.Since(u.start).Seconds()
	u.report.LeaseLapses = lapses - u.lapses0
	u.done = ro.State != api.RolloutRunning
}

// simUpgrader is a simulated agent's nodeagent.Upgrader.
type simUpgrader struct {
	version string
	base    string // the agent's control-plane URL, whose host the fetch goes to
	client  *http.Client
	restart chan<- string // the agent's replacement, given the new version
}

// Upgrade confirms a command for the version this agent runs; otherwise it
// fetches and checks the release and has the agent replaced, never
// returning, as a real agent's exec does not.
func (u *simUpgrader) Upgrade(ctx context.Context, _ string, c nodeproto.UpgradeAgentCommand) error {
	if c.Version == u.version {
		return nil
	}
	// The read names the replica's own address; the simulated agents
	// reach replicas by the router's names (a load balancer's address).
	loc, err := url.Parse(c.URL)
	if err != nil {
		return err
	}
	base, _ := url.Parse(u.base)
	loc.Scheme, loc.Host = base.Scheme, base.Host
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, loc.String(), nil)
	if err != nil {
		return err
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return fmt.Errorf("fetch the release: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch the release: %s", resp.Status)
	}
	b, err := agentrelease.Read(resp.Body, agentrelease.Expect{SHA256: c.SHA256, Size: c.Size})
	if err != nil {
		return err
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != c.SHA256 {
		return fmt.Errorf("the release hashes to %x, not %s", sum, c.SHA256)
	}
	u.restart <- c.Version
	select {} // the exec: this agent never answers the command; its successor does
}
